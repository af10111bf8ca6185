"""lmdeploy's data for the shared guard (:mod:`portable_guided.integrations._guard`): which
lmdeploy functions each takeover relies on, the fingerprints of every verified lmdeploy
build, and how a call's kind reads for the canary.

Regenerate :data:`KNOWN` for a new build with
``python -m portable_guided.integrations.lmdeploy.guard`` in a venv with that lmdeploy.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .. import _guard
from .._guard import FORCED, Canary, EngineGuard, Fingerprints

__all__ = ["FORCED", "FUNCTIONS", "GUARD", "KNOWN", "TAKEOVER_FUNCTIONS", "Kind", "Takeover",
           "canary", "current", "kind_of"]

logger = logging.getLogger("lmdeploy.plugins.portable_guided")

_GP = "lmdeploy.pytorch.engine.guided_process"
_LP = "lmdeploy.pytorch.engine.logits_process"
_SPEC = "lmdeploy.pytorch.spec_decode.guided_spec_helper"
_ENGINE = "lmdeploy.pytorch.engine.engine"

#: lmdeploy function name used in :data:`KNOWN` -> (module, qualified name).
FUNCTIONS: dict[str, tuple[str, str]] = {
    "apply_batched_bitmap": (_GP, "GuidedDecodingManager.apply_batched_bitmap"),
    "allocate_batched_bitmap": (_GP, "GuidedDecodingManager.allocate_batched_bitmap"),
    "fill_bitmap": (_GP, "GuidedDecodingManager.fill_bitmap"),
    "manager_init": (_GP, "GuidedDecodingManager.__init__"),
    "get_processors": (_GP, "GuidedDecodingManager.get_processors"),
    "get_processor": (_GP, "GuidedDecodingManager.get_processor"),
    "remove_processor": (_GP, "GuidedDecodingManager.remove_processor"),
    "accept_token": (_GP, "GuidedDecodingManager.accept_token"),
    "is_terminated": (_GP, "GuidedDecodingManager.is_terminated"),
    "clear": (_GP, "GuidedDecodingManager.clear"),
    "fused_call": (_LP, "FusedLogitsProcessor.__call__"),
    "fused_init": (_LP, "FusedLogitsProcessor.__init__"),
    "fused_fill": (_LP, "FusedLogitsProcessor._fill_guided_bitmask"),
    "fused_accept": (_LP, "FusedLogitsProcessor._accept_guided_tokens"),
    "fused_cleanup": (_LP, "FusedLogitsProcessor.cleanup_sessions"),
    "spec_apply_bitmask": (_SPEC, "GuidedSpecHelper.apply_bitmask"),
    "spec_apply_serial": (_SPEC, "GuidedSpecHelper.apply_serial_bitmask"),
    "spec_prepare_bitmask": (_SPEC, "GuidedSpecHelper.prepare_bitmask"),
    "spec_fill": (_SPEC, "GuidedSpecHelper._fill_bitmask"),
    "spec_accept_forked": (_SPEC, "GuidedSpecHelper._accept_forked_at_pos"),
    "spec_accept_draft": (_SPEC, "GuidedSpecHelper.accept_draft_tokens"),
    "spec_accept_rejection": (_SPEC, "GuidedSpecHelper.accept_rejection_sampled_tokens"),
    "engine_add_message": (_ENGINE, "Engine._add_message"),
}

#: Takeover -> the functions it relies on.
#:
#: ``apply``: ``apply_batched_bitmap`` itself; the callers that hand it logits and a bitmask
#: (``FusedLogitsProcessor.__call__``, the speculative helper's applies on full and strided
#: ``[:, pos, :]`` views) and how they allocate and fill that bitmask (one xgrammar row per
#: logits row, ``-1`` = all allowed).
#: ``backend``: every ``GuidedDecodingManager`` method the runtime backend replaces, and every
#: caller that drives them (the processor's construction, fill and accept; the speculative
#: helper's fill, fork and accept paths), and ``Engine._add_message``, where a request's
#: compile is submitted at admission.
TAKEOVER_FUNCTIONS: dict[str, tuple[str, ...]] = {
    "apply": ("apply_batched_bitmap", "allocate_batched_bitmap", "fill_bitmap", "fused_call",
              "fused_fill", "spec_apply_bitmask", "spec_apply_serial", "spec_prepare_bitmask",
              "spec_fill"),
    "backend": tuple(name for name in FUNCTIONS if name != "apply_batched_bitmap"),
}

#: Verified lmdeploy builds: version -> fingerprint per function.
KNOWN: dict[str, dict[str, str | None]] = {
    # lmdeploy 0.18.0 from the registry (the lmdeploy-cpu lane runs its PyTorch engine's
    # guided-decoding modules on the CPU).
    "0.18.0": {
        "apply_batched_bitmap": "3d6f7633dc0a8b53",
        "allocate_batched_bitmap": "69fa080d6442b4de",
        "fill_bitmap": "f9f3a1efe0cce73d",
        "manager_init": "fb358d083cd221e6",
        "get_processors": "e9f53199ebf8a6cc",
        "get_processor": "4bee8bc81b2e17fd",
        "remove_processor": "0f7864a66b2f3110",
        "accept_token": "ed3a3188a7b43a11",
        "is_terminated": "508e1d9553819c13",
        "clear": "73a64d654a1c6a50",
        "fused_call": "9ff05c1f45f33c06",
        "fused_init": "8b9bff6398e6de5b",
        "fused_fill": "84accd809c0f96c7",
        "fused_accept": "a59f1ecaf11c4f91",
        "fused_cleanup": "4c499ab7654c0c0a",
        "spec_apply_bitmask": "7a1c5ae1beafc2c2",
        "spec_apply_serial": "e30f482e69a03aa5",
        "spec_prepare_bitmask": "b79f8f1168ec00d8",
        "spec_fill": "34d3f0a9a778228c",
        "spec_accept_forked": "734794b98f10fd41",
        "spec_accept_draft": "65e7d34daf0c07e3",
        "spec_accept_rejection": "d49f74b131ba9d68",
        "engine_add_message": "3ecfd083ea074d8a",
    },
}

#: A call's kind: device type, dtype, logits wider than the mask, a strided (non-contiguous)
#: view, some rows unconstrained (all-allowed bitmask rows).
Kind = tuple[str, Any, bool, bool]


def kind_of(logits: Any, bitmask: Any) -> Kind:
    """A call's kind for the canary (host metadata only, paid on every call)."""
    return ("cpu" if logits.is_cpu else logits.device.type, logits.dtype,
            logits.shape[-1] > 32 * bitmask.shape[-1], not logits.is_contiguous())


def _describe(call: frozenset[Any]) -> str:
    return "; ".join(f"device {device}, {dtype}, logits wider than mask: {wider}, strided "
                     f"view: {strided}" for device, dtype, wider, strided in call)


#: lmdeploy's fingerprints and canary wording.
GUARD = EngineGuard("lmdeploy", logger, FUNCTIONS, TAKEOVER_FUNCTIONS, KNOWN,
                    "apply_batched_bitmap", _describe)


def current(version: str, originals: dict[str, Any] | None = None) -> Fingerprints:
    """Fingerprints of the installed lmdeploy. ``originals`` overrides a function by name
    (lmdeploy's own, when ours is installed already)."""
    return GUARD.current(version, originals)


def canary(takeover: str, restore: Callable[[], None]) -> Canary:
    """The canary of one takeover; ``restore`` puts lmdeploy's function back."""
    return Canary(GUARD, takeover, restore)


@dataclass(kw_only=True)
class Takeover(_guard.Takeover):
    """``GuidedDecodingManager.apply_batched_bitmap`` replaced (:attr:`name` ``apply``)."""


def _main() -> None:  # pragma: no cover - a maintainer's tool
    import json

    import lmdeploy

    print(json.dumps(current(str(lmdeploy.__version__)).values, indent=8))


if __name__ == "__main__":  # pragma: no cover
    _main()
