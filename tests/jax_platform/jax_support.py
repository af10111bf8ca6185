"""Helpers for the JAX tests: random logits and bitmasks, and a count of XLA compilations
taken from JAX's own monitoring events."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import jax
import numpy as np

COMPILE_EVENT = "/jax/core/compile/backend_compile_duration"
_compiles: list[float] = []


def _listen(event: str, duration: float, **_: object) -> None:
    if event == COMPILE_EVENT:
        _compiles.append(duration)


jax.monitoring.register_event_duration_secs_listener(_listen)


@contextlib.contextmanager
def count_compiles() -> Iterator[list[float]]:
    """Yields a list that, on exit, holds one duration per XLA compilation inside the block."""
    start = len(_compiles)
    seen: list[float] = []
    try:
        yield seen
    finally:
        seen.extend(_compiles[start:])


def random_bitmask(rng: np.random.Generator, rows: int, words: int) -> np.ndarray:
    """Random int32 words (bit 31 set in about half of them), with a sparse JSON-like row,
    an all-allowed row and an all-blocked row among the first three."""
    mask = rng.integers(-(2**31), 2**31, (rows, words), dtype=np.int64).astype(np.int32)
    if rows >= 3:
        mask[0] = 0
        mask[0, min(3, words - 1)] = 0b1011
        mask[1] = -1
        mask[2] = 0
    return mask


def xla_owned(values: np.ndarray, dtype: str) -> jax.Array:
    """``values`` as a device array whose buffer XLA allocated (so it can be donated):
    ``device_put`` of a NumPy array may share the NumPy buffer instead."""
    return jax.device_put(np.asarray(values, dtype=np.float32)).astype(dtype) + 0
