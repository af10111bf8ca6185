"""Host-side preparation shared by the static-shape kernels (Torch and Paddle).

Static-shape devices get one int32 bitmask with exactly one row per logits row and enough
words to cover every logits column. Rows that are not masked and columns at or past
``vocab_size`` are all-allowed, so the device graph depends only on the logits' shape and
dtype, never on ``indices`` or ``vocab_size``.
"""

from __future__ import annotations

import numpy as np

from ..validation import MaskPlan

__all__ = ["BIT_VALUES", "device_words", "expand_bitmask", "column_allow_words"]

# Single-bit int32 values (bit 31 is -2**31): unpacking with `word & value != 0` avoids
# `>>`, which is not an arithmetic shift for negative int32 on some XLA backends.
BIT_VALUES = (np.uint32(1) << np.arange(32, dtype=np.uint32)).view(np.int32)


def device_words(width: int) -> int:
    """Words of the device bitmask for logits of ``width`` columns."""
    return -(-width // 32)


def column_allow_words(vocab_size: int, width: int) -> np.ndarray:
    """Per word, the bits that must read as allowed because their column is at or past
    ``vocab_size`` (int32, length ``device_words(width)``)."""
    out = np.zeros(device_words(width), dtype=np.uint32)
    first_word, tail = divmod(vocab_size, 32)
    if tail:
        out[first_word] = np.uint32((0xFFFFFFFF << tail) & 0xFFFFFFFF)
        first_word += 1
    out[first_word:] = 0xFFFFFFFF
    return out.view(np.int32)


def expand_bitmask(
    bitmask: np.ndarray, plan: MaskPlan, out: np.ndarray | None = None
) -> np.ndarray:
    """The device-ready host bitmask: shape ``(plan.batch, device_words(plan.width))``.

    ``out`` may be a reusable buffer of that shape (for instance pinned memory).
    """
    words = device_words(plan.width)
    if out is None:
        out = np.empty((plan.batch, words), dtype=np.int32)
    table = bitmask.reshape(plan.bitmask_rows, plan.bitmask_words)
    used = min(words, plan.bitmask_words)
    if plan.rows is None:
        out[:, :used] = table[:, :used]
        out[:, used:] = -1
    else:
        out.fill(-1)
        out[plan.rows, :used] = table[plan.rows, :used]
    out |= column_allow_words(plan.vocab_size, plan.width)
    return out
