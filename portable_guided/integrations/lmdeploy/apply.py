"""``GuidedDecodingManager.apply_batched_bitmap``, served by :func:`portable_guided.apply_token_mask`.

lmdeploy 0.18.0's PyTorch engine masks a batch's logits with one call,
``manager.apply_batched_bitmap(logits, bitmask)``: from ``FusedLogitsProcessor.__call__``
(one xgrammar bitmask row per logits row, ``-1`` for rows without a grammar) and from the
speculative helper (``GuidedSpecHelper.apply_bitmask`` on draft logits,
``apply_serial_bitmask`` on each strided ``scores_3d[:, pos, :]`` view). Upstream runs
xgrammar's kernel on CPU and CUDA (after a synchronous ``.to(device)`` of the bitmask), and on
every other device (Ascend ``npu``, Cambricon ``mlu``, MACA) copies the logits to the host as
float32, masks them there and copies them back.

Here the same bitmask masks the logits in place on their own device and in their own dtype:
the registry picks the platform (CUDA: the bitmask staged in pinned memory and copied without
blocking; ``npu``: the static-shape platform; any other device: the static fallback), so the
logits never leave the device. The semantics are xgrammar's: columns past ``32 * words`` are
left alone.
"""

from __future__ import annotations

import logging
import os
import threading
from typing import Any

from ...apply import apply_token_mask
from ...registry import resolve
from .guard import Takeover, kind_of

__all__ = ["TAKEOVER", "apply_batched_bitmap", "apply_bitmap", "lmdeploy_reference"]

logger = logging.getLogger("lmdeploy.plugins.portable_guided")

#: Set by :func:`portable_guided.integrations.lmdeploy.register` while ours is installed:
#: lmdeploy's own function, the verified build and the canary.
TAKEOVER: Takeover | None = None
_first_apply = threading.Event()


def apply_bitmap(logits: Any, bitmask: Any) -> None:
    """Mask ``logits`` (2-D, any row stride, any device and float dtype) in place with
    ``bitmask`` (int32 words, one row per logits row, on the CPU or the logits' device) with
    xgrammar's semantics: columns past ``32 * bitmask.shape[-1]`` are left alone, without the
    warning a narrower mask gives elsewhere (lmdeploy's manager sizes its bitmask from the
    tokenizer, often narrower than a padded lm_head)."""
    width = int(logits.shape[-1])
    covered = 32 * int(bitmask.shape[-1])
    if covered < width:
        masked = apply_token_mask(logits, bitmask, vocab_size=covered)
    else:
        masked = apply_token_mask(logits, bitmask)
    if masked is not logits:  # a platform that is not in place (none built in today)
        logits.copy_(masked)
    if not _first_apply.is_set():
        _first_apply.set()
        logger.info("portable_guided applied the first grammar bitmask in this lmdeploy "
                    "process (pid %d): %s", os.getpid(), resolve(logits))


def lmdeploy_reference(logits: Any, bitmask: Any) -> None:
    """lmdeploy 0.18.0's ``apply_batched_bitmap`` body, for when its function is not at hand
    (a call already on its way while ours was removed)."""
    import xgrammar as xgr

    device, dtype = logits.device, logits.dtype
    if device.type in {"cpu", "cuda"}:
        xgr.apply_token_bitmask_inplace(logits, bitmask.to(device))
    else:
        host = logits.cpu().float()
        xgr.apply_token_bitmask_inplace(host, bitmask.cpu())
        logits.copy_(host.to(device, dtype))


def apply_batched_bitmap(self: Any, logits: Any, guided_bitmask: Any) -> None:
    """Replaces ``GuidedDecodingManager.apply_batched_bitmap`` (lmdeploy 0.18.0): the same
    masked logits, in place on their own device. The first call of each kind (device, dtype,
    logits wider than the mask, strided view) is compared with lmdeploy's own function on a
    copy (the canary)."""
    takeover = TAKEOVER
    if takeover is None:  # removed while this call was on its way: lmdeploy's own
        lmdeploy_reference(logits, guided_bitmask)
        return
    canary = takeover.canary
    if canary is not None and not canary.tripped:
        kind = kind_of(logits, guided_bitmask)
        if kind not in canary.seen:
            original = takeover.original
            canary.check(logits, (kind,), lambda out: apply_bitmap(out, guided_bitmask),
                         lambda out: original(self, out, guided_bitmask))
            return
    apply_bitmap(logits, guided_bitmask)
