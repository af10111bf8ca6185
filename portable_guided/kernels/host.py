"""The CPU kernel: vectorized NumPy on the bit patterns of host logits.

Where the compiled kernel is built (``kernels/compiled.py``), ``apply_host`` hands the work to
it; this NumPy kernel is the fallback with the same results, and the thread pool here serves
both.

Works on Torch, Paddle and NumPy logits through zero-copy integer views, so one kernel serves
every framework and every float dtype (bfloat16 included). Rows are sorted into three kinds:

- all-allowed rows are skipped (reading their bitmask is the whole cost);
- sparse rows (few allowed tokens, the usual JSON case) are filled with -inf in one write
  pass and the few allowed values are saved and put back; this costs less than reading and
  writing the row;
- nearly-full rows (few blocked tokens, e.g. inside a JSON string) get -inf written at the
  blocked positions only: for Torch logits by xgrammar's CPU kernel when xgrammar is
  installed (its C++ bit loop beat our vectorized index math 3-10x on these rows, see
  ``XGRAMMAR_MAX_BLOCKED``), else by NumPy fancy indexing;
- dense rows are unpacked one row at a time (the unpacked row stays in cache) and merged with
  branch-free integer operations, which beat a boolean ``masked_fill``/``where`` several fold
  on random masks.

Thread policy (measured, bench/results/apply_cpu_after_matmul.json): the kernel usually runs
right after a framework op (the lm_head matmul), whose OpenMP threads keep spinning for a while
after it returns. For Torch logits, a large -inf fill therefore runs as a Torch ``fill_`` on
those same threads (Torch's intra-op pool), and dense rows are merged on the calling thread:
two NumPy threads next to spinning OpenMP threads were slower than one. NumPy and Paddle logits
use the kernel's own thread pool for work of at least ``PARALLEL_MIN_BYTES``. Setting
``PORTABLE_GUIDED_CPU_THREADS`` (e.g. to 1 on a machine whose cores other processes share:
there Torch's pool waits for descheduled threads and one thread was 3-8x faster) uses that
many NumPy threads for every framework instead.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from ..dlpack import host_array, host_bits, host_int32
from ..validation import MaskPlan
from .host_common import (
    NEG_INF_BITS,
    PARALLEL_MIN_BYTES,
    THREADS_ENV_VAR,
    _run_split,
    _split_rows,
    _threads,
)

__all__ = ["apply_host", "apply_host_arrays", "NEG_INF_BITS"]


# A row with at most width / SPARSE_RATIO allowed tokens takes the fill-and-restore path.
SPARSE_RATIO = 16

# Torch rows blocking at most this share of the vocabulary go to xgrammar's CPU kernel when it
# is installed: it walks the cleared bits of each word in C++, so its cost follows the blocked
# tokens; beyond these shares our dense merge was as fast or faster (bench/bench_apply.py
# --position after-matmul, masks blocked6/10/20/30: bfloat16 even at 10%, float32 at 30%).
# ``PORTABLE_GUIDED_CPU_XGRAMMAR=0`` turns the route off.
XGRAMMAR_MAX_BLOCKED = {"float32": 0.25, "bfloat16": 0.08, "float16": 0.08}

# Rows are sorted into paths by their share of allowed tokens, estimated from every
# COUNT_STRIDE-th word: a full popcount cost a third of the whole JSON-mask kernel, and every
# path is exact for any row (a wrong estimate costs time, never correctness).
COUNT_STRIDE = 8
XGRAMMAR_ENV_VAR = "PORTABLE_GUIDED_CPU_XGRAMMAR"
_xgrammar_kernel: Any = None
_xgrammar_checked = False

_ALL_ONES = np.uint32(0xFFFFFFFF)

_compiled: Any = None  # kernels/compiled.py, imported on the first call


def apply_host(logits: Any, bitmask: Any, plan: MaskPlan) -> Any:
    """Mask host logits in place (Torch, Paddle or NumPy); returns ``logits``.

    Uses the compiled kernel (``kernels/compiled.py``) where it is built, else NumPy."""
    global _compiled
    if _compiled is None:
        from . import compiled as _compiled  # loads the extension: not at import time
    if _compiled.available():
        array, words = host_array(logits, plan.framework, plan.dtype), host_int32(bitmask)
        # The compiled kernel walks contiguous columns; other layouts take the NumPy kernel.
        if array.strides[-1] == array.itemsize:
            _compiled.apply_compiled(array.reshape(1, -1) if array.ndim == 1 else array,
                                     words.reshape(1, -1) if words.ndim == 1 else words, plan)
            return logits
    bits = host_bits(logits, plan.framework, plan.dtype).reshape(plan.batch, plan.width)
    tensor = None
    if plan.framework == "torch" and not os.environ.get(THREADS_ENV_VAR):
        import torch

        # A fresh tensor over the bits (signed, as Torch fills those): in-place ops on it are
        # allowed even when ``logits`` is an inference-mode tensor, like the NumPy writes.
        tensor = torch.from_numpy(bits.view(np.int32 if bits.itemsize == 4 else np.int16))
    apply_host_arrays(bits, host_int32(bitmask), plan, tensor)
    return logits


def apply_host_arrays(
    bits: np.ndarray, bitmask: np.ndarray, plan: MaskPlan, tensor: Any = None
) -> None:
    """Mask ``bits`` (2-D unsigned view of the logits) in place from an int32 bitmask.

    ``tensor``: the same memory as a 2-D signed-integer ``torch.Tensor`` (int32 or int16, like
    ``bits``), or ``None``; given, the thread policy for Torch logits applies (module
    docstring).
    """
    vocab = plan.vocab_size
    words = -(-vocab // 32)
    rows = plan.masked_rows
    full_bitmask = bitmask.reshape(plan.bitmask_rows, plan.bitmask_words)
    table = _selected_words(full_bitmask, plan, words)

    live = table.min(axis=1) != _ALL_ONES
    if not live.all():
        if not live.any():
            return
        table, rows = table[live], rows[live]
    allowed = _allowed_per_row(table)
    sparse = allowed * SPARSE_RATIO <= vocab
    # Bits past vocab are set, so words * 32 - allowed counts the blocked tokens.
    blocked = words * 32 - allowed
    neg = bits.dtype.type(NEG_INF_BITS[plan.dtype])
    if sparse.any():
        _apply_sparse(bits, *_pick(sparse, rows, table), vocab, neg, tensor)
    few_blocked = ~sparse & (blocked <= XGRAMMAR_MAX_BLOCKED[plan.dtype] * vocab)
    if tensor is not None and few_blocked.any() and _xgrammar_cpu() is not None:
        # Bitmask row i belongs to logits row i unless ``indices`` picked rows: then the
        # routed rows' words are copied into a bitmask xgrammar can index like the logits.
        if plan.rows is None and plan.bitmask_rows == plan.batch:
            routed_rows, routed_bitmask = _pick(few_blocked, rows, None)[0], full_bitmask
        else:
            routed_rows, routed_words = _pick(few_blocked, rows, table)
            routed_bitmask = np.full((plan.batch, words), -1, dtype=np.int32)
            routed_bitmask[routed_rows] = routed_words.view(np.int32)
        _apply_xgrammar(tensor, plan.dtype, routed_rows, vocab, routed_bitmask)
        sparse = sparse | few_blocked  # done: neither nearly-full nor dense below
    nearly_full = ~sparse & (blocked * SPARSE_RATIO <= vocab)
    if nearly_full.any():
        # Blocked tokens are the set bits of the inverted words (none past vocab).
        row_of, cols = _set_bits(np.invert(table[nearly_full]), rows[nearly_full])
        target, where = _flat_view(bits, row_of, cols)
        target[where] = neg
    dense = ~(sparse | nearly_full)
    dense_rows, dense_words = rows[dense], table[dense]
    if dense_rows.size:

        def merge(piece: tuple[int, int]) -> None:
            for i in range(*piece):
                _apply_dense_row(bits[dense_rows[i], :vocab], dense_words[i], vocab, neg)

        # Next to Torch's spinning OpenMP threads, one NumPy thread beat two (measured).
        threads = 1 if tensor is not None else _threads()
        _run_split(merge, _split_rows(0, dense_rows.size, threads),
                   dense_rows.size * vocab * bits.itemsize)


def _allowed_per_row(table: np.ndarray) -> np.ndarray:
    """Allowed tokens per row of ``table`` (uint32 words), estimated from a strided sample of
    the words when rows are long, exact otherwise."""
    words = table.shape[1]
    if words < 64 * COUNT_STRIDE:
        return np.bitwise_count(table).sum(axis=1, dtype=np.int64)
    sample = table[:, ::COUNT_STRIDE]
    counted = np.bitwise_count(sample).sum(axis=1, dtype=np.int64)
    return counted * words // sample.shape[1]


def _pick(selected: np.ndarray, rows: np.ndarray, table: np.ndarray | None) -> tuple[Any, Any]:
    """``rows`` and ``table`` (or None) restricted to the ``selected`` rows; no copy when every
    row is selected (a copy of a whole table costs as much as a pass over it)."""
    if selected.all():
        return rows, table
    return rows[selected], None if table is None else table[selected]


def _xgrammar_cpu() -> Any:
    """xgrammar's CPU kernel, imported on first need; None without xgrammar or when turned off."""
    global _xgrammar_kernel, _xgrammar_checked
    if os.environ.get(XGRAMMAR_ENV_VAR, "1") == "0":
        return None
    if not _xgrammar_checked:
        try:
            from xgrammar.kernels.apply_token_bitmask_inplace_cpu import (
                apply_token_bitmask_inplace_cpu,
            )
        except ImportError:
            apply_token_bitmask_inplace_cpu = None
        _xgrammar_kernel, _xgrammar_checked = apply_token_bitmask_inplace_cpu, True
    return _xgrammar_kernel


def _apply_xgrammar(
    tensor: Any, dtype: str, rows: np.ndarray, vocab: int, bitmask: np.ndarray
) -> None:
    """Mask ``rows`` of the logits (``tensor``: their integer view) with xgrammar's CPU kernel,
    which indexes logits and ``bitmask`` with the same row numbers."""
    import torch

    logits = tensor.view(getattr(torch, dtype))  # plan dtypes are Torch's names
    indices = None if rows.size == logits.shape[0] else rows.tolist()
    _xgrammar_cpu()(logits, torch.from_numpy(np.ascontiguousarray(bitmask)), vocab, indices)


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


def _set_bits(words: np.ndarray, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(row, column)`` of every set bit of ``words`` (uint32, one row of words per entry of
    ``rows``, the logits rows). Only nonzero words are unpacked, so the cost follows the number
    of set bits rather than the vocabulary."""
    flat = np.ascontiguousarray(words, dtype="<u4").reshape(-1)
    # Nonzero 8-byte units are found by a comparison and a nonzero over its bool result,
    # 2-3x faster than a nonzero over the bytes (measured right after an lm_head matmul).
    units = flat.view(np.uint64) if flat.size % 2 == 0 else flat
    unit_bits = units.itemsize * 8
    nonzero = np.flatnonzero(units != 0)
    unpacked = np.unpackbits(units[nonzero].view(np.uint8), bitorder="little")
    set_bit = np.flatnonzero(unpacked.view(bool))  # index into (nonzero unit, bit)
    position = nonzero[set_bit // unit_bits] * unit_bits + set_bit % unit_bits
    row_bits = words.shape[1] * 32
    return rows[position // row_bits], position % row_bits


def _apply_sparse(
    bits: np.ndarray,
    rows: np.ndarray,
    table: np.ndarray,
    vocab: int,
    neg: np.generic,
    tensor: Any,
) -> None:
    """Fill the sparse ``rows`` with -inf, keeping the tokens whose bits are set in
    ``table`` (their words)."""
    row_of, cols = _set_bits(table, rows)
    keep = cols < vocab  # bits past vocab were only set to mark them allowed
    cols, row_of = cols[keep], row_of[keep]
    flat, where = _flat_view(bits, row_of, cols)
    saved = flat[where]
    runs = _row_runs(np.sort(rows))
    nbytes = rows.size * vocab * bits.itemsize
    if tensor is not None and nbytes >= PARALLEL_MIN_BYTES:
        signed = int(np.array(neg, dtype=bits.dtype).view(tensor.numpy().dtype))
        for start, stop in runs:  # in Torch's intra-op pool (module docstring)
            tensor[start:stop, :vocab].fill_(signed)
    else:
        threads = _threads() if nbytes >= PARALLEL_MIN_BYTES else 1
        pieces = [piece for start, stop in runs for piece in _split_rows(start, stop, threads)]

        def fill(piece: tuple[int, int]) -> None:
            bits[piece[0] : piece[1], :vocab] = neg

        _run_split(fill, pieces, nbytes)
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
