"""Batch buckets for static-shape devices, as pure functions.

Graph-compiled devices (XLA/TPU, and others run through the static-shape strategy) compile
one graph per input shape. Engines pad their batch to one of a few bucket sizes so a
decode loop with a changing batch reuses a handful of graphs.
"""

from __future__ import annotations

import operator
from dataclasses import dataclass

__all__ = ["BucketPolicy", "bucket_sizes", "bucket_for"]


def _positive_int(name: str, value: int) -> int:
    try:
        value = operator.index(value)
    except TypeError:
        raise TypeError(f"{name} must be an int, got {type(value).__name__}") from None
    if value < 1:
        raise ValueError(f"{name} must be >= 1, got {value}")
    return value


def bucket_sizes(max_batch: int, min_bucket: int = 8) -> tuple[int, ...]:
    """Powers of two times ``min_bucket`` below ``max_batch``, then ``max_batch`` itself.

    >>> bucket_sizes(100)
    (8, 16, 32, 64, 100)
    >>> bucket_sizes(4, min_bucket=8)
    (4,)
    """
    max_batch = _positive_int("max_batch", max_batch)
    size = _positive_int("min_bucket", min_bucket)
    sizes = []
    while size < max_batch:
        sizes.append(size)
        size *= 2
    sizes.append(max_batch)
    return tuple(sizes)


def bucket_for(n: int, max_batch: int, min_bucket: int = 8) -> int:
    """The smallest bucket that holds ``n`` rows.

    >>> bucket_for(9, max_batch=256)
    16
    """
    n = _positive_int("n", n)
    for size in bucket_sizes(max_batch, min_bucket):
        if n <= size:
            return size
    raise ValueError(f"batch {n} exceeds the largest bucket (max_batch={max_batch})")


@dataclass(frozen=True)
class BucketPolicy:
    """A bucket configuration: powers of two from ``min_bucket``, capped at ``max_batch``."""

    max_batch: int = 256
    min_bucket: int = 8

    def __post_init__(self) -> None:
        bucket_sizes(self.max_batch, self.min_bucket)  # validates both

    @property
    def sizes(self) -> tuple[int, ...]:
        """All bucket sizes, ascending."""
        return bucket_sizes(self.max_batch, self.min_bucket)

    def bucket_for(self, n: int) -> int:
        """The smallest bucket that holds ``n`` rows."""
        return bucket_for(n, self.max_batch, self.min_bucket)
