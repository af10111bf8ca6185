"""What the CPU kernels share (``kernels/host.py``'s NumPy kernel and the compiled one,
``kernels/compiled.py``): the bit pattern of ``-inf`` per dtype and the split of a job over
a few threads."""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np

__all__ = ["NEG_INF_BITS", "PARALLEL_MIN_BYTES", "THREADS_ENV_VAR"]

# Bit pattern of -inf per logits dtype.
NEG_INF_BITS = {"float32": 0xFF800000, "float16": 0xFC00, "bfloat16": 0xFF80}

# NumPy releases the GIL in fills and ufunc loops, so a few threads reach the memory bandwidth
# that one core cannot. Work smaller than this many bytes stays on the calling thread.
THREADS_ENV_VAR = "PORTABLE_GUIDED_CPU_THREADS"
PARALLEL_MIN_BYTES = 4 << 20

# Read once: os.cpu_count() costs several microseconds, paid on every call otherwise.
_DEFAULT_THREADS = min(4, os.cpu_count() or 1)

_pool: ThreadPoolExecutor | None = None
_pool_size = 0
_pool_lock = threading.Lock()


def _threads() -> int:
    value = os.environ.get(THREADS_ENV_VAR)
    if value:
        try:
            return max(1, int(value))
        except ValueError:
            raise ValueError(f"{THREADS_ENV_VAR} must be an integer, got {value!r}") from None
    return _DEFAULT_THREADS


def _run_split(work: Callable[[Any], None], parts: Sequence[Any], nbytes: int) -> None:
    """Run ``work`` on each part, on the kernel's threads when the job is large enough."""
    global _pool, _pool_size
    threads = min(_threads(), len(parts))
    if threads <= 1 or nbytes < PARALLEL_MIN_BYTES:
        for part in parts:
            work(part)
        return
    with _pool_lock:  # kernels may run on several engine threads at once
        if _pool_size < threads:  # grows when the setting grows
            _pool = ThreadPoolExecutor(threads, thread_name_prefix="portable-guided-cpu")
            _pool_size = threads
        pool = _pool
    assert pool is not None  # for mypy: created above
    for _ in pool.map(work, parts):  # consume: re-raises a worker's exception
        pass


def _split_rows(start: int, stop: int, pieces: int) -> list[tuple[int, int]]:
    if pieces <= 1 or stop - start <= 1:
        return [(start, stop)]
    bounds = np.linspace(start, stop, min(pieces, stop - start) + 1).astype(int)
    return [(int(a), int(b)) for a, b in zip(bounds[:-1], bounds[1:])]
