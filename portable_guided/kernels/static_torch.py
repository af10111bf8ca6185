"""The static-shape kernel for Torch logits (XLA/TPU, XPU, NPU, unknown devices, and CPU when
forced).

The bitmask is expanded on the host to one row per logits row (see ``static_common``), moved to
the device in one transfer, and applied by one graph whose shapes depend only on the logits:
unpack bits with ``word & bit != 0`` (never ``>>``), then ``torch.where``. The logits never
leave the device, and a decode loop whose logits keep the same shape reuses one graph.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any

import numpy as np

from ..dlpack import host_int32
from ..registry import REGISTRY
from ..validation import MaskPlan, plan_mask
from .static_common import BIT_VALUES, column_allow_words, device_words, expand_bitmask

if TYPE_CHECKING:
    import torch

__all__ = ["apply_static_torch", "warmup"]

# Torch is imported inside the functions (a lookup in sys.modules once loaded), so importing
# this module stays light; Torch logits mean Torch is already imported.


@functools.lru_cache(maxsize=64)
def _column_allow(device: torch.device, vocab_size: int, width: int) -> torch.Tensor:
    import torch

    return torch.from_numpy(column_allow_words(vocab_size, width)).to(device)


def apply_static_torch(logits: torch.Tensor, bitmask: Any, plan: MaskPlan) -> torch.Tensor:
    """Mask ``logits`` in place with one static-shape graph; returns ``logits``."""
    import torch

    table = logits.view(plan.batch, plan.width)
    if plan.bitmask_on_host:
        host = torch.from_numpy(expand_bitmask(host_int32(bitmask), plan))
        mask = host if logits.device.type == "cpu" else host.to(logits.device)
    else:
        mask = _expand_on_device(bitmask, plan, logits.device)
    _masked_where(table, mask)
    return logits


@functools.lru_cache(maxsize=64)
def _column_bits(device: torch.device, width: int) -> torch.Tensor:
    """Per logits column, its bit's value within its word (int32, length ``width``)."""
    import torch

    return torch.from_numpy(np.resize(BIT_VALUES, width)).to(device)


def _masked_where(table: torch.Tensor, mask: torch.Tensor) -> None:
    import torch

    rows, width = table.shape
    words = mask.shape[1]
    # Each column reads its word by broadcasting (no gather), then one 2-D bit test: XLA fuses
    # it into a single elementwise loop. A (rows, words, 32) boolean reshaped to 2-D is 5-10x
    # slower on XLA:CPU.
    per_column = mask.unsqueeze(-1).expand(rows, words, 32).reshape(rows, words * 32)
    allowed = (per_column[:, :width] & _column_bits(table.device, width)) != 0
    table.copy_(torch.where(allowed, table, float("-inf")))


def _expand_on_device(bitmask: torch.Tensor, plan: MaskPlan, device: torch.device) -> torch.Tensor:
    """Device-side version of ``expand_bitmask`` for a bitmask already on the device."""
    import torch

    words = device_words(plan.width)
    mask = bitmask.reshape(plan.bitmask_rows, plan.bitmask_words)
    mask = mask[: plan.batch, :words]
    pad_rows, pad_words = plan.batch - mask.shape[0], words - mask.shape[1]
    if pad_rows or pad_words:
        mask = torch.nn.functional.pad(mask, (0, pad_words, 0, pad_rows), value=-1)
    mask = mask | _column_allow(device, plan.vocab_size, plan.width)
    if plan.rows is not None:
        selected = np.zeros(plan.batch, dtype=bool)
        selected[plan.rows] = True
        # The one small row-selector transfer; unselected rows read as all-allowed.
        selector = torch.from_numpy(selected).to(device)
        mask = torch.where(selector.unsqueeze(-1), mask, -1)
    return mask


def warmup(
    rows: int,
    width: int,
    dtype: torch.dtype,
    device: torch.device | str,
    vocab_size: int | None = None,
) -> None:
    """Run the apply graph once for logits of shape ``(rows, width)``, so a graph-compiled
    device compiles (and caches) it before serving traffic."""
    import torch

    device = torch.device(device)
    # Built on the host and uploaded: created on the device, the zeros would compile a fill
    # graph per bucket on XLA, counted and cached besides the apply graph.
    logits = torch.zeros(rows, width, dtype=dtype).to(device)
    bitmask = torch.full((rows, device_words(width)), -1, dtype=torch.int32)
    # A lazy device (XLA) runs what it recorded only when flushed: first the upload, so the
    # logits become device data as in a real decode step, then the apply graph.
    platform = REGISTRY.for_device(device.type)
    platform.flush(logits)
    plan = plan_mask(logits, bitmask, vocab_size=vocab_size)
    apply_static_torch(logits, bitmask, plan)
    platform.flush(logits)
