"""A candidate Triton kernel for ``bench_apply.py --device cuda``, not yet measured on a GPU.

Session 15 measured on an H200 that both Triton kernels that write ``-inf`` through a
per-element store mask (ours in ``portable_guided/kernels/triton_mask.py`` and xgrammar's)
take 2.3-4x the time of a full read+write of bf16 logits under JSON-like masks. This one
loads each block of logits and stores ``where(blocked, -inf, x)`` with only the vocabulary
bound as a mask, so loads and stores can be vectorized, and skips the logits entirely where a
block's words are all -1 (everything allowed) or all 0 (store -inf without loading).

If it measures well, it replaces the kernel in ``kernels/triton_mask.py`` (same arguments).
Check it first under Triton's interpreter on the CPU::

    TRITON_INTERPRET=1 python bench/triton_candidates.py
"""

from __future__ import annotations

import os
import sys

import triton
import triton.language as tl

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from portable_guided.kernels.triton_mask import BLOCK, apply_triton


@triton.jit
def _dense_kernel(
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
    row = row.to(tl.int64)
    start = tl.program_id(1) * BLOCK_SIZE
    word_index = start // 32 + tl.arange(0, BLOCK_SIZE // 32)
    words = tl.load(bitmask_ptr + row * bitmask_row_stride + word_index,
                    mask=word_index * 32 < vocab_size, other=-1)
    some_blocked = tl.sum((words != -1).to(tl.int32), axis=0) > 0
    some_allowed = tl.sum((words != 0).to(tl.int32), axis=0) > 0
    columns = start + tl.arange(0, BLOCK_SIZE)
    in_vocab = columns < vocab_size
    pointers = logits_ptr + row * logits_row_stride + columns
    if some_blocked:
        if some_allowed:
            bits = tl.load(bitmask_ptr + row * bitmask_row_stride + columns // 32,
                           mask=in_vocab, other=-1)
            blocked = ((bits >> (columns % 32)) & 1) == 0
            x = tl.load(pointers, mask=in_vocab)
            tl.store(pointers, tl.where(blocked, float("-inf"), x), mask=in_vocab)
        else:
            tl.store(pointers, float("-inf"), mask=in_vocab)


def apply_dense(table, bitmask, vocab_size, rows):
    """Same contract as ``portable_guided.kernels.triton_mask.apply_triton``."""
    apply_triton(table, bitmask, vocab_size, rows, kernel=_dense_kernel)


if __name__ == "__main__":  # parity against the NumPy reference (interpreter or GPU)
    import numpy as np
    import torch

    from portable_guided import reference_apply_token_mask as reference

    device = "cpu" if os.environ.get("TRITON_INTERPRET") == "1" else "cuda"
    rng = np.random.default_rng(0)
    wrong = 0
    for case in range(36):
        dtype = (torch.float32, torch.float16, torch.bfloat16)[case % 3]
        batch, width = int(rng.integers(1, 6)), int(rng.integers(1, 3 * BLOCK))
        words = max(1, -(-width // 32) + int(rng.integers(-2, 3)))
        vocab = max(0, min(width, 32 * words) - int(rng.integers(0, 40)))
        bitmask = rng.integers(-2**31, 2**31, (batch, words), dtype=np.int64).astype(np.int32)
        kind = case % 4  # random words, some all-allowed blocks, some all-blocked, mixed
        if kind in (1, 3):
            bitmask[:, : words // 2] = -1
        if kind in (2, 3):
            bitmask[:, words // 2 :] = 0
        values = rng.standard_normal((batch, width + 7)).astype(np.float32)
        wide = torch.from_numpy(values).to(dtype).to(device)
        logits = wide[:, 3 : 3 + width]
        before = logits.float().cpu().numpy()
        rows = None
        if case % 2:
            rows = rng.permutation(batch)[: int(rng.integers(1, batch + 1))].tolist()
        expected = reference(before, bitmask, indices=rows, vocab_size=vocab)
        apply_dense(logits, torch.from_numpy(bitmask).to(device), vocab,
                    None if rows is None else torch.tensor(rows, dtype=torch.int32,
                                                           device=device))
        if not np.array_equal(logits.float().cpu().numpy(), expected):
            wrong += 1
            print("differs:", dtype, batch, width, words, vocab, rows, kind)
    print(f"{36 - wrong}/36 cases equal the reference")
    sys.exit(1 if wrong else 0)
