"""Why the SGLang plugin never applies a wrong mask: SGLang's data for the shared guard.

The fingerprints, the matching and the canary are :mod:`portable_guided.integrations._guard`'s,
shared by every engine plugin; this module says which SGLang functions they cover, holds the
fingerprints of every verified build and describes an SGLang call (:func:`kind_of`).

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
that batch and SGLang's function back in place for the rest of the process; if SGLang's own
function raises, it is put back too and its error propagates. Where SGLang's
own function cannot run (the static ``XGrammarGrammarBackend.apply_vocab_mask`` raises
``Unsupported device: cpu``), the reference is SGLang's CPU path of the same mask format
(``XGrammarGrammar.apply_vocab_mask``: xgrammar's CPU kernel) on a CPU copy.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .. import _guard
from .._guard import (
    FORCED,
    Canary,
    EngineGuard,
    Fingerprints,
    describe_difference,
    fingerprint,
    same,
)

__all__ = ["FORCED", "FUNCTIONS", "GUARD", "HOOK_FUNCTIONS", "KNOWN", "Canary", "Fingerprints",
           "Kind", "Takeover", "canary", "current", "describe_difference", "fingerprint", "kind_of",
           "match", "mismatches", "same"]

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


Kind = tuple[str, Any, int, bool]


def kind_of(logits: Any, vocab_mask: Any) -> Kind:
    """A call's kind for the canary: device type, dtype, rank, logits wider than the mask.
    Paid on every call, so the cheapest Torch reads: ``is_cpu`` before building a device,
    the dtype object instead of its name."""
    return ("cpu" if logits.is_cpu else logits.device.type, logits.dtype, logits.dim(),
            logits.shape[-1] > 32 * vocab_mask.shape[-1])


def _describe(call: frozenset[Any]) -> str:
    return "; ".join(f"device {device}, {dtype}, {rank}-D, logits wider than mask: {wider}"
                     for device, dtype, rank, wider in call)


#: SGLang's fingerprints and canary wording, for :mod:`portable_guided.integrations._guard`.
GUARD = EngineGuard("SGLang", logger, FUNCTIONS, HOOK_FUNCTIONS, KNOWN, "apply_vocab_mask",
                    _describe)


def current(version: str, originals: dict[str, Any] | None = None) -> Fingerprints:
    """Fingerprints of the installed SGLang. ``originals`` overrides a function by name
    (SGLang's own, when ours is installed already)."""
    return GUARD.current(version, originals)


def match(found: Fingerprints, hook: str) -> bool:
    """Whether every function ``hook`` relies on matches the verified build of
    ``found``'s version (an unknown version never matches)."""
    return GUARD.match(found, hook) is not None


def mismatches(found: Fingerprints, hook: str) -> str:
    """Why ``hook`` matches no verified build, for the warning."""
    return GUARD.mismatches(found, hook)


def canary(hook: str, restore: Callable[[], None]) -> Canary:
    """The canary of one hook; ``restore`` puts SGLang's function back. A call's kinds are
    ``(kind_of(logits, vocab_mask),)``."""
    return Canary(GUARD, hook, restore)


@dataclass(kw_only=True)
class Takeover(_guard.Takeover):
    """One hook installed (:attr:`name`): the ``HookRegistry`` target and whether SGLang's
    function is a ``staticmethod``, besides SGLang's function, the build and the canary."""

    target: str
    static: bool


def _main() -> None:  # pragma: no cover - a maintainer's tool
    import json

    import sglang

    print(json.dumps(current(str(sglang.__version__)).values, indent=4))


if __name__ == "__main__":  # pragma: no cover
    _main()
