"""The static-shape kernel for Paddle logits (Paddle XPU and custom devices, and Paddle CPU
when forced): the same algorithm as ``static_torch`` written with Paddle ops.

The final merge works on the logits' bit patterns (``(bits & keep) | (-inf & ~keep)``) rather
than ``paddle.where``, because Paddle's CPU ``where`` has no float16 or bfloat16 kernel.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from ..dlpack import host_int32
from ..validation import MaskPlan
from .static_common import BIT_VALUES, column_allow_words, device_words, expand_bitmask

if TYPE_CHECKING:
    import paddle

__all__ = ["apply_static_paddle"]

# Paddle is imported inside the functions, so importing this module stays light; Paddle logits
# mean Paddle is already imported.

# Signed integer view and the -inf bit pattern per logits dtype.
_NEG_INF_BITS = {
    "float32": ("int32", -(2**23)),  # 0xFF800000
    "float16": ("int16", -1024),  # 0xFC00
    "bfloat16": ("int16", -128),  # 0xFF80
}

_column_bits_cache: dict[tuple[str, int], paddle.Tensor] = {}


def _column_bits(place: Any, width: int) -> paddle.Tensor:
    """Per logits column, its bit's value within its word (int32, length ``width``)."""
    import paddle

    key = (str(place), width)
    if key not in _column_bits_cache:
        _column_bits_cache[key] = paddle.to_tensor(np.resize(BIT_VALUES, width), place=place)
    return _column_bits_cache[key]


def apply_static_paddle(logits: paddle.Tensor, bitmask: Any, plan: MaskPlan) -> paddle.Tensor:
    """Mask ``logits`` in place with static-shape Paddle ops; returns ``logits``."""
    import paddle

    place = logits.place
    table = logits.reshape([plan.batch, plan.width])
    if plan.bitmask_on_host:
        mask = paddle.to_tensor(expand_bitmask(host_int32(bitmask), plan), place=place)
    else:
        mask = _expand_on_device(bitmask, plan, place)
    words = mask.shape[1]
    # Each column reads its word by broadcasting, then one 2-D bit test (fuses on devices).
    per_column = mask.unsqueeze(-1).expand([plan.batch, words, 32]).reshape([plan.batch, -1])
    allowed = paddle.bitwise_and(per_column[:, : plan.width], _column_bits(place, plan.width)) != 0
    bits_dtype, neg_bits = _NEG_INF_BITS[plan.dtype]
    bits = paddle.view(table, bits_dtype)
    keep = -paddle.cast(allowed, bits_dtype)  # allowed -> all ones, masked -> 0
    neg = paddle.bitwise_and(paddle.bitwise_not(keep), paddle.full([], neg_bits, bits_dtype))
    bits.copy_(paddle.bitwise_or(paddle.bitwise_and(bits, keep), neg), False)
    return logits


def _expand_on_device(bitmask: paddle.Tensor, plan: MaskPlan, place: Any) -> paddle.Tensor:
    import paddle

    words = device_words(plan.width)
    mask = bitmask.reshape([plan.bitmask_rows, plan.bitmask_words])[: plan.batch, :words]
    pad_rows, pad_words = plan.batch - mask.shape[0], words - mask.shape[1]
    if pad_words:
        mask = paddle.concat([mask, paddle.full([mask.shape[0], pad_words], -1, "int32")], 1)
    if pad_rows:
        mask = paddle.concat([mask, paddle.full([pad_rows, words], -1, "int32")], 0)
    allow = column_allow_words(plan.vocab_size, plan.width)
    mask = paddle.bitwise_or(mask, paddle.to_tensor(allow, place=place))
    if plan.rows is not None:
        selected = np.zeros((plan.batch, 1), dtype=bool)
        selected[plan.rows] = True
        selector = paddle.to_tensor(selected, place=place)
        mask = paddle.where(selector, mask, paddle.full([], -1, "int32"))
    return mask
