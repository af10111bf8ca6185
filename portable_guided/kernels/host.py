"""The CPU kernel: vectorized NumPy on the bit patterns of host logits.

Works on Torch, Paddle and NumPy logits through zero-copy integer views, so one kernel serves
every framework and every float dtype (bfloat16 included). Rows are sorted into three kinds:

- all-allowed rows are skipped (reading their bitmask is the whole cost);
- sparse rows (few allowed tokens, the usual JSON case) are filled with -inf in one write
  pass and the few allowed values are saved and put back; this costs less than reading and
  writing the row;
- dense rows are unpacked one row at a time (the unpacked row stays in cache) and merged with
  branch-free integer operations, which beat a boolean ``masked_fill``/``where`` several fold
  on random masks.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np

from ..dlpack import host_bits, host_int32
from ..validation import MaskPlan

__all__ = ["apply_host", "apply_host_arrays", "NEG_INF_BITS"]

# Bit pattern of -inf per logits dtype.
NEG_INF_BITS = {"float32": 0xFF800000, "float16": 0xFC00, "bfloat16": 0xFF80}

# A row with at most width / SPARSE_RATIO allowed tokens takes the fill-and-restore path.
SPARSE_RATIO = 16

_ALL_ONES = np.uint32(0xFFFFFFFF)

# NumPy releases the GIL in fills and ufunc loops, so a few threads reach the memory bandwidth
# that one core cannot. Work smaller than this many bytes stays on the calling thread.
THREADS_ENV_VAR = "PORTABLE_GUIDED_CPU_THREADS"
PARALLEL_MIN_BYTES = 4 << 20

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
    return min(4, os.cpu_count() or 1)


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
    bounds = np.linspace(start, stop, min(pieces, stop - start) + 1).astype(int)
    return [(int(a), int(b)) for a, b in zip(bounds[:-1], bounds[1:])]


def apply_host(logits: Any, bitmask: Any, plan: MaskPlan) -> Any:
    """Mask host logits in place (Torch, Paddle or NumPy); returns ``logits``."""
    bits = host_bits(logits)
    apply_host_arrays(bits.reshape(plan.batch, plan.width), host_int32(bitmask), plan)
    return logits


def apply_host_arrays(bits: np.ndarray, bitmask: np.ndarray, plan: MaskPlan) -> None:
    """Mask ``bits`` (2-D unsigned view of the logits) in place from an int32 bitmask."""
    vocab = plan.vocab_size
    words = -(-vocab // 32)
    rows = plan.masked_rows
    table = _selected_words(bitmask.reshape(plan.bitmask_rows, plan.bitmask_words), plan, words)

    live = table.min(axis=1) != _ALL_ONES
    if not live.all():
        if not live.any():
            return
        table, rows = table[live], rows[live]
    # One pass finds every nonzero word; it both sizes the rows and feeds the sparse path.
    flat = np.flatnonzero(table != 0)
    values = table.ravel()[flat]
    local_row = flat // words
    allowed = np.bincount(local_row, weights=np.bitwise_count(values), minlength=rows.size)
    sparse = allowed * SPARSE_RATIO <= vocab
    neg = bits.dtype.type(NEG_INF_BITS[plan.dtype])
    if sparse.any():
        in_sparse = sparse[local_row]
        _apply_sparse(bits, rows, sparse, local_row[in_sparse], flat[in_sparse] % words,
                      values[in_sparse], vocab, neg)
    dense_rows, dense_words = rows[~sparse], table[~sparse]
    if dense_rows.size:

        def dense(piece: tuple[int, int]) -> None:
            for i in range(*piece):
                _apply_dense_row(bits[dense_rows[i], :vocab], dense_words[i], vocab, neg)

        _run_split(dense, _split_rows(0, dense_rows.size, _threads()),
                   dense_rows.size * vocab * bits.itemsize)


def _selected_words(bitmask: np.ndarray, plan: MaskPlan, words: int) -> np.ndarray:
    """The masked rows' first ``words`` words as uint32, bits past ``vocab`` set (allowed)."""
    if plan.rows is None:
        table = bitmask[:, :words]
    else:
        table = bitmask[plan.rows, :words]
    tail = plan.vocab_size % 32
    if tail:
        table = table.astype(np.int32, copy=True).view(np.uint32)
        table[:, -1] |= np.uint32((0xFFFFFFFF << tail) & 0xFFFFFFFF)
        return table
    return np.ascontiguousarray(table).view(np.uint32)


def _row_runs(rows: np.ndarray) -> list[tuple[int, int]]:
    """Sorted row indices grouped into [start, stop) runs of consecutive rows."""
    if rows[-1] - rows[0] + 1 == rows.size:  # the usual case: one run
        return [(int(rows[0]), int(rows[-1]) + 1)]
    breaks = np.flatnonzero(np.diff(rows) != 1) + 1
    starts = np.concatenate(([0], breaks))
    stops = np.concatenate((breaks, [rows.size]))
    return [(int(rows[a]), int(rows[b - 1]) + 1) for a, b in zip(starts, stops)]


def _apply_sparse(
    bits: np.ndarray,
    rows: np.ndarray,
    sparse: np.ndarray,
    local_row: np.ndarray,
    word: np.ndarray,
    values: np.ndarray,
    vocab: int,
    neg: np.generic,
) -> None:
    """Fill the sparse rows with -inf, keeping the tokens whose bits are set.

    ``local_row``/``word``/``values`` list the nonzero words of those rows (``local_row``
    indexes ``rows``).
    """
    unpacked = np.unpackbits(
        values.astype("<u4", copy=False).view(np.uint8).reshape(-1, 4), axis=1, bitorder="little"
    )
    set_bit = np.flatnonzero(unpacked.view(bool))  # index into (nonzero word, bit)
    of_word = set_bit // 32
    cols = word[of_word] * 32 + set_bit % 32
    row_of = rows[local_row[of_word]]
    keep = cols < vocab  # bits past vocab were only set to mark them allowed
    cols, row_of = cols[keep], row_of[keep]
    flat, where = _flat_view(bits, row_of, cols)
    saved = flat[where]
    pieces = [
        piece
        for start, stop in _row_runs(np.sort(rows[sparse]))
        for piece in _split_rows(start, stop, _threads())
    ]

    def fill(piece: tuple[int, int]) -> None:
        bits[piece[0] : piece[1], :vocab] = neg

    _run_split(fill, pieces, int(sparse.sum()) * vocab * bits.itemsize)
    flat[where] = saved


def _flat_view(bits: np.ndarray, rows: np.ndarray, cols: np.ndarray) -> tuple[np.ndarray, Any]:
    """A 1-D view over the rows' memory and indices into it (1-D fancy indexing is several
    times faster than 2-D); falls back to 2-D indices for unusual strides."""
    item = bits.itemsize
    row_stride, col_stride = bits.strides
    if col_stride != item or row_stride % item or row_stride < bits.shape[1] * item:
        return bits, (rows, cols)
    step = row_stride // item
    span = (bits.shape[0] - 1) * step + bits.shape[1]
    flat = np.lib.stride_tricks.as_strided(bits, shape=(span,), strides=(item,))
    return flat, rows * step + cols


def _apply_dense_row(row: np.ndarray, row_words: np.ndarray, vocab: int, neg: np.generic) -> None:
    unpacked = np.unpackbits(
        row_words.astype("<u4", copy=False).view(np.uint8), bitorder="little", count=vocab
    )
    keep = unpacked.astype(row.dtype)
    np.negative(keep, out=keep)  # 1 -> all ones, 0 -> 0
    np.bitwise_and(row, keep, out=row)
    np.invert(keep, out=keep)
    np.bitwise_and(keep, neg, out=keep)
    np.bitwise_or(row, keep, out=row)
