"""Why the SGLang plugin never applies a wrong mask: fingerprints before patching, a canary after.

**Fingerprints.** Each hook replaces one SGLang ``apply_vocab_mask`` and reproduces what it
does with the mask that SGLang's own ``allocate_vocab_mask`` and fill produce (the layout),
called the way ``GrammarMask.apply`` calls it. :data:`KNOWN` holds the SHA-256 of the source
of every function a hook relies on, for each SGLang build the plugin was verified against.
A hook is registered only when all of its functions match the installed version's build;
anything else is left to SGLang with one warning (``PORTABLE_GUIDED_SGLANG=force`` patches
anyway, loudly).

**Canary.** The first call of each kind (device type, dtype, rank, and whether the logits
are wider than the mask) of each hook also runs SGLang's own function on a copy of the
logits and compares exactly. On any difference: an error in the log, SGLang's result for
that batch and SGLang's function back in place for the rest of the process. Where SGLang's
own function cannot run (the static ``XGrammarGrammarBackend.apply_vocab_mask`` raises
``Unsupported device: cpu``), the reference is SGLang's CPU path of the same mask format
(``XGrammarGrammar.apply_vocab_mask``: xgrammar's CPU kernel) on a CPU copy.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ..vllm.guard import describe_difference, fingerprint

__all__ = ["FUNCTIONS", "HOOK_FUNCTIONS", "KNOWN", "Canary", "Kind", "Takeover", "current",
           "fingerprint", "kind_of", "match", "mismatches", "same"]

logger = logging.getLogger("sglang.plugins.portable_guided")

_XGR = "sglang.srt.constrained.xgrammar_backend"
_LLG = "sglang.srt.constrained.llguidance_backend"
_OUT = "sglang.srt.constrained.outlines_backend"
_BASE = "sglang.srt.constrained.base_grammar_backend"

#: SGLang function name used in :data:`KNOWN` -> (module, qualified name).
FUNCTIONS: dict[str, tuple[str, str]] = {
    "grammar_mask_apply": (_BASE, "GrammarMask.apply"),
    "xgr_grammar_apply": (_XGR, "XGrammarGrammar.apply_vocab_mask"),
    "xgr_grammar_allocate": (_XGR, "XGrammarGrammar.allocate_vocab_mask"),
    "xgr_backend_apply": (_XGR, "XGrammarGrammarBackend.apply_vocab_mask"),
    "xgr_backend_allocate": (_XGR, "XGrammarGrammarBackend.allocate_vocab_mask"),
    "xgr_allocate_bitmask": (_XGR, "_allocate_token_bitmask"),
    "llg_grammar_apply": (_LLG, "GuidanceGrammar.apply_vocab_mask"),
    "llg_grammar_allocate": (_LLG, "GuidanceGrammar.allocate_vocab_mask"),
    "out_grammar_apply": (_OUT, "OutlinesGrammar.apply_vocab_mask"),
    "out_grammar_allocate": (_OUT, "OutlinesGrammar.allocate_vocab_mask"),
    "out_grammar_fill": (_OUT, "OutlinesGrammar.fill_vocab_mask"),
    "out_grammar_move": (_OUT, "OutlinesGrammar.move_vocab_mask"),
}

#: Hook name -> what the hook relies on (the function it replaces first).
HOOK_FUNCTIONS: dict[str, tuple[str, ...]] = {
    "xgrammar": ("xgr_grammar_apply", "xgr_grammar_allocate", "xgr_allocate_bitmask",
                 "grammar_mask_apply"),
    "xgrammar_static": ("xgr_backend_apply", "xgr_backend_allocate", "xgr_allocate_bitmask",
                        "xgr_grammar_apply", "grammar_mask_apply"),
    "llguidance": ("llg_grammar_apply", "llg_grammar_allocate", "grammar_mask_apply"),
    "outlines": ("out_grammar_apply", "out_grammar_allocate", "out_grammar_fill",
                 "out_grammar_move", "grammar_mask_apply"),
}

#: Verified SGLang builds: version -> fingerprint per function. Regenerate with
#: ``python -m portable_guided.integrations.sglang.guard`` in a venv with that SGLang.
KNOWN: dict[str, dict[str, str | None]] = {
    # sglang 0.5.23 from the registry (the sglang-cpu lane runs its grammar modules on CPU).
    "0.5.23": {
        "grammar_mask_apply": "d0afead6992fc5b8",
        "xgr_grammar_apply": "ce153090649dac33",
        "xgr_grammar_allocate": "5e424ca29406d062",
        "xgr_backend_apply": "ef1b01c4cfdbc0ee",
        "xgr_backend_allocate": "514104865672d579",
        "xgr_allocate_bitmask": "d2bd4364e0ce8bb5",
        "llg_grammar_apply": "ccc6257afb79ce54",
        "llg_grammar_allocate": "8b21a27f48d1ea85",
        # (SGLang's outlines backend, imported with outlines 0.1.14 in the lane)
        "out_grammar_apply": "74300c44e03e8f35",
        "out_grammar_allocate": "5be191b52583c2e5",
        "out_grammar_fill": "a36af66951b0397d",
        "out_grammar_move": "62b48525be18d3ea",
    },
}


@dataclass(frozen=True)
class Fingerprints:
    """The fingerprints of one installed SGLang; ``None`` for functions it lacks."""

    version: str
    values: dict[str, str | None] = field(default_factory=dict)


def _resolve(module_name: str, qualname: str) -> Any:
    import importlib
    import inspect

    try:
        obj: Any = importlib.import_module(module_name)
    except ImportError:
        return None
    for part in qualname.split("."):
        # Through __dict__ where possible: a staticmethod stays a plain function and a
        # property is found (its getter is fingerprinted).
        raw = (obj.__dict__.get(part) if inspect.isclass(obj) else None)
        obj = raw if raw is not None else getattr(obj, part, None)
        if obj is None:
            return None
        if isinstance(obj, (staticmethod, classmethod)):
            obj = obj.__func__
        elif isinstance(obj, property):
            obj = obj.fget
    return obj


def current(version: str, originals: dict[str, Any] | None = None) -> Fingerprints:
    """Fingerprints of the installed SGLang. ``originals`` overrides a function by name
    (SGLang's own, when ours is installed already)."""
    values: dict[str, str | None] = {}
    for name, (module_name, qualname) in FUNCTIONS.items():
        obj = (originals or {}).get(name) or _resolve(module_name, qualname)
        obj = getattr(obj, "__wrapped__", obj)
        try:
            values[name] = None if obj is None else fingerprint(obj)
        except (OSError, TypeError):  # no source (compiled, or built at run time)
            values[name] = "no-source"
    return Fingerprints(version, values)


def match(found: Fingerprints, hook: str) -> bool:
    """Whether every function ``hook`` relies on matches the verified build of
    ``found``'s version (an unknown version never matches)."""
    known = KNOWN.get(found.version.split("+")[0])
    return known is not None and all(
        found.values.get(n) is not None and found.values.get(n) == known.get(n)
        for n in HOOK_FUNCTIONS[hook])


def mismatches(found: Fingerprints, hook: str) -> str:
    """Why ``hook`` matches no verified build, for the warning."""
    known = KNOWN.get(found.version.split("+")[0])
    if known is None:
        return f"SGLang {found.version} is not a verified build"
    differ = [n for n in HOOK_FUNCTIONS[hook] if found.values.get(n) != known.get(n)]
    named = ", ".join(f"{FUNCTIONS[n][0]}.{FUNCTIONS[n][1]}" for n in differ)
    return f"the source of {named} differs from the verified {found.version}"


def same(a: Any, b: Any) -> bool:
    """Exact equality of two logits tensors, NaN equal to NaN."""
    import torch

    return bool(torch.equal(a, b) or torch.equal(a.isnan(), b.isnan())
                and torch.equal(a.nan_to_num(0.0, 1.0, -1.0), b.nan_to_num(0.0, 1.0, -1.0)))


Kind = tuple[str, Any, int, bool]


def kind_of(logits: Any, vocab_mask: Any) -> Kind:
    """A call's kind for the canary: device type, dtype, rank, logits wider than the mask.
    Paid on every call, so the cheapest Torch reads: ``is_cpu`` before building a device,
    the dtype object instead of its name."""
    return ("cpu" if logits.is_cpu else logits.device.type, logits.dtype, logits.dim(),
            logits.shape[-1] > 32 * vocab_mask.shape[-1])


class Canary:
    """Compares one hook with SGLang's own function on the first call of each kind.

    ``restore`` puts SGLang's function back (called once, on the first difference).
    """

    def __init__(self, hook: str, restore: Callable[[], None]) -> None:
        self.hook = hook
        self.restore = restore
        self.seen: set[Kind] = set()
        self.tripped = False
        self.checks = 0
        self._lock = threading.Lock()

    def due(self, kind: Kind) -> bool:
        """Whether this kind of call has not been checked yet (host metadata only)."""
        return not self.tripped and kind not in self.seen

    def check(
        self,
        logits: Any,
        kind: Kind,
        ours: Callable[[Any], None],
        theirs: Callable[[Any], None],
    ) -> bool:
        """Run ``theirs`` on a copy and ``ours`` on ``logits``; on a difference keep
        SGLang's logits, restore SGLang's function and return False. An exception from
        ``theirs`` is SGLang's own behaviour: it propagates, with SGLang's function back."""
        with self._lock:
            reference = logits.clone()
            self.seen.add(kind)
            self.checks += 1
            try:
                theirs(reference)
            except Exception:
                self._trip("SGLang's own function raised on this input (its error follows)",
                           kind)
                raise
            try:
                ours(logits)
            except Exception as exc:  # noqa: BLE001 - ours failing is a difference too
                what = f"raised {type(exc).__name__}: {exc}"
            else:
                if same(logits, reference):
                    return True
                what = describe_difference(logits, reference, "SGLang's")
            logits.copy_(reference)
            self._trip(what, kind)
            return False

    def _trip(self, what: str, kind: Kind) -> None:
        logger.error(
            "portable_guided's %s apply_vocab_mask %s (device %s, %s, %d-D, logits wider "
            "than mask: %s): SGLang's result is used for this batch and SGLang's own "
            "function is restored for the rest of this process. Please report this with "
            "your SGLang version.", self.hook, what, *kind)
        self.tripped = True
        self.restore()


@dataclass
class Takeover:
    """One hook installed: SGLang's function it replaced and its canary."""

    hook: str
    target: str
    original: Callable[..., Any]
    static: bool
    forced: bool = False
    canary: Canary | None = None


def _main() -> None:  # pragma: no cover - a maintainer's tool
    import json

    import sglang

    print(json.dumps(current(str(sglang.__version__)).values, indent=4))


if __name__ == "__main__":  # pragma: no cover
    _main()
