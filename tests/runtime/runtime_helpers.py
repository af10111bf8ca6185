"""Reference helpers for the runtime tests (plain integer arithmetic and NumPy)."""

from __future__ import annotations

import numpy as np


def allowed(bitmask_row: np.ndarray, vocab: int) -> np.ndarray:
    """Token ids whose bit is set in one bitmask row."""
    bits = np.unpackbits(np.ascontiguousarray(bitmask_row).view(np.uint8), bitorder="little")
    return np.nonzero(bits[:vocab])[0]


def is_allowed(bitmask_row: np.ndarray, token: int) -> bool:
    """Whether bit ``token`` is set."""
    word = int(bitmask_row[token // 32]) & 0xFFFFFFFF
    return bool((word >> (token % 32)) & 1)
