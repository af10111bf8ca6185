"""The obviously correct reference for ``apply_token_mask``, in plain NumPy.

Slow on purpose: one Python-level bit test per (row, token), written straight from the
definition of xgrammar's bitmask, so the fast implementations are checked against something
that shares none of their tricks.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

__all__ = ["reference_apply_token_mask"]


def reference_apply_token_mask(
    logits: np.ndarray,
    bitmask: np.ndarray,
    *,
    indices: Sequence[int] | None = None,
    vocab_size: int | None = None,
) -> np.ndarray:
    """Return a masked copy of ``logits``.

    Token ``t`` of row ``r`` stays when bit ``t % 32`` of ``bitmask[r, t // 32]`` is set and
    becomes ``-inf`` otherwise, for ``t < vocab_size`` (default: as many columns as both
    arrays cover) and for the rows in ``indices`` (default: every row).

    >>> import numpy as np
    >>> reference_apply_token_mask(np.zeros(4, np.float32), np.array([0b0101], np.int32))
    array([  0., -inf,   0., -inf], dtype=float32)
    """
    out = np.array(logits, copy=True)
    table = out.reshape(1, -1) if out.ndim == 1 else out
    words = np.asarray(bitmask).reshape(1, -1) if np.ndim(bitmask) == 1 else np.asarray(bitmask)
    if vocab_size is None:
        vocab_size = min(table.shape[1], 32 * words.shape[1])
    rows = range(table.shape[0]) if indices is None else [int(i) for i in indices]
    for row in rows:
        for token in range(vocab_size):
            word = int(words[row, token // 32])  # Python ints: >> is an arithmetic shift
            if (word >> (token % 32)) & 1 == 0:
                table[row, token] = -np.inf
    return out
