"""Our Triton kernel for in-place masking of GPU logits.

One program per (row, block of ``BLOCK`` columns), each thread reading the bitmask word of its
column and writing ``-inf`` where the bit is clear. xgrammar's Triton kernel runs one
persistent program per SM that loops over the blocks; on an H200 that reached 20-40% of the
device's copy rate at B >= 64 with JSON-like masks, where this grid shape lets every SM keep
many blocks in flight (``bench/results/apply_cuda_s15.json``). The semantics are xgrammar's:
column ``c`` of row ``r`` is masked when bit ``c % 32`` of ``bitmask[r, c // 32]`` is clear.

Imported on first use only (it imports Triton).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import triton
import triton.language as tl

if TYPE_CHECKING:
    import torch

__all__ = ["apply_triton"]

BLOCK = 2048  # columns per program


@triton.jit  # a Triton kernel: its parameters carry no Python types
def _mask_kernel(  # type: ignore[no-untyped-def]
    logits_ptr,
    bitmask_ptr,
    rows_ptr,
    vocab_size,
    logits_row_stride,
    bitmask_row_stride,
    HAS_ROWS: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
):
    program_row = tl.program_id(0)
    row = tl.load(rows_ptr + program_row) if HAS_ROWS else program_row
    row = row.to(tl.int64)  # B * V can pass 2**31 elements
    columns = tl.program_id(1) * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
    in_vocab = columns < vocab_size
    # 32 neighbouring threads read the same word: one transaction, served from L1.
    words = tl.load(bitmask_ptr + row * bitmask_row_stride + columns // 32, mask=in_vocab,
                    other=-1)
    blocked = ((words >> (columns % 32)) & 1) == 0
    tl.store(logits_ptr + row * logits_row_stride + columns, float("-inf"),
             mask=in_vocab & blocked)


def apply_triton(
    table: torch.Tensor, bitmask: torch.Tensor, vocab_size: int, rows: torch.Tensor | None
) -> None:
    """Mask ``table`` (2-D, unit column stride) in place from ``bitmask`` (2-D int32, unit
    column stride, on the same device), for columns below ``vocab_size`` and the rows in
    ``rows`` (1-D int32 on the device; each names a row of both) or every row."""
    count = table.shape[0] if rows is None else rows.shape[0]
    if count == 0 or vocab_size == 0:
        return
    grid = (count, triton.cdiv(vocab_size, BLOCK))
    _mask_kernel[grid](
        table, bitmask, rows if rows is not None else bitmask, vocab_size,
        table.stride(0), bitmask.stride(0),
        HAS_ROWS=rows is not None, BLOCK_SIZE=BLOCK,
        num_warps=8,
    )
