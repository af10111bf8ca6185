"""Our Triton kernels (``kernels/triton_mask.py``, every variant) against the NumPy reference,
run by Triton's interpreter on CPU tensors (``TRITON_INTERPRET=1``), so they are checked on
every CI run; on a GPU, ``tests/test_cuda.py`` checks the compiled kernels through
``apply_token_mask``.

The interpreter is chosen when ``triton.jit`` decorates the kernel, so the cases run in a
fresh process.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

pytest.importorskip("triton")
pytest.importorskip("torch")

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

CASES = r'''
import json, sys
import numpy as np, torch
from portable_guided import reference_apply_token_mask as reference
from portable_guided.kernels.triton_mask import BLOCK, apply_triton

variant, blocks, block = sys.argv[3], int(sys.argv[4]), int(sys.argv[5]) or BLOCK
rng = np.random.default_rng(int(sys.argv[1]))
results = []
for case in range(int(sys.argv[2])):
    dtype = (torch.float32, torch.float16, torch.bfloat16)[case % 3]
    with_rows = case % 2 == 1
    batch = int(rng.integers(1, 6))
    # Widths around the kernel's block size, so partial and several blocks are covered.
    width = int(rng.integers(1, 3 * block * blocks))
    words = max(1, -(-width // 32) + int(rng.integers(-2, 3)))  # narrower or wider bitmask
    vocab = max(0, min(width, 32 * words) - int(rng.integers(0, 40)))
    values = rng.standard_normal((batch, width + 7)).astype(np.float32)
    wide = torch.from_numpy(values).to(dtype)
    logits = wide[:, 3 : 3 + width]  # rows strided, not contiguous
    bitmask = rng.integers(-2**31, 2**31, (batch + 2, words), dtype=np.int64).astype(np.int32)
    bitmask[0] = 0
    bitmask[-1] = -1
    if case % 4 == 2:  # whole blocks and words that allow all or nothing, beside mixed ones
        bitmask[:, : words // 3] = -1
        bitmask[:, words // 3 : 2 * words // 3] = 0
    before = wide.float().numpy().copy()
    rows = None
    if with_rows:
        rows = rng.permutation(batch)[: int(rng.integers(1, batch + 1))].tolist()
        expected = reference(before[:, 3 : 3 + width], bitmask, indices=rows, vocab_size=vocab)
        apply_triton(logits, torch.from_numpy(bitmask), vocab, torch.tensor(rows, dtype=torch.int32),
                     variant, block=block, blocks=blocks)
    else:
        expected = reference(before[:, 3 : 3 + width], bitmask[:batch], vocab_size=vocab)
        apply_triton(logits, torch.from_numpy(bitmask[:batch].copy()), vocab, None, variant,
                     block=block, blocks=blocks)
    after = wide.float().numpy()
    outside_same = (np.array_equal(after[:, :3], before[:, :3])
                    and np.array_equal(after[:, 3 + width :], before[:, 3 + width :]))
    results.append({"dtype": str(dtype), "rows": rows is not None, "width": width,
                    "vocab": vocab, "equal": bool(np.array_equal(logits.float().numpy(), expected)),
                    "outside_same": bool(outside_same),
                    "masked": int(np.isneginf(expected).sum())})
print(json.dumps(results))
'''


VARIANTS = ["triton-word", "triton-dense", "triton-element", "triton-tiered"]


def test_every_variant_is_tested():
    from portable_guided.kernels.triton_mask import DEFAULT_VARIANT
    from portable_guided.kernels.triton_mask import VARIANTS as DEFINED

    assert sorted(DEFINED) == sorted(VARIANTS) and DEFAULT_VARIANT in VARIANTS


# (variant, blocks per program, columns per block; 0: the variant's narrow block)
SHAPES = [(variant, blocks, 0) for variant in VARIANTS for blocks in (1, 3)]
SHAPES.append(("triton-tiered", 1, 8192))  # its wide block


@pytest.mark.parametrize(("variant", "blocks", "block"), SHAPES)
def test_triton_kernel_matches_reference_under_the_interpreter(variant, blocks, block):
    env = dict(os.environ, TRITON_INTERPRET="1", PYTHONPATH=ROOT)
    seed = str(blocks)
    out = subprocess.run([sys.executable, "-c", CASES, seed, "24", variant, str(blocks),
                          str(block)], env=env,
                         cwd=ROOT,
                         capture_output=True, text=True, timeout=600, check=False)
    assert out.returncode == 0, out.stderr[-3000:]
    results = json.loads(out.stdout.strip().splitlines()[-1])
    wrong = [r for r in results if not (r["equal"] and r["outside_same"])]
    assert not wrong, wrong
    # The cases did cover what they are for: each dtype, with and without rows, several
    # blocks per row, and masks that block something.
    assert {r["dtype"] for r in results} == {"torch.float32", "torch.float16", "torch.bfloat16"}
    assert {r["rows"] for r in results} == {True, False}
    assert max(r["width"] for r in results) > (block or 2048)
    assert sum(r["masked"] for r in results) > 0


def test_the_tiered_kernel_widens_its_blocks_once_the_grid_is_large():
    from portable_guided.kernels.triton_mask import BLOCK, VARIANTS, WIDE_MIN_PROGRAMS

    tiered = VARIANTS["triton-tiered"]
    wide = tiered.wide_block
    assert wide > BLOCK
    assert tiered.columns(1, 151_936) == BLOCK
    assert tiered.columns(256, 151_936) == wide
    # The grid it would have at the wide block decides, at the threshold exactly.
    assert tiered.columns(WIDE_MIN_PROGRAMS, wide) == wide
    assert tiered.columns(WIDE_MIN_PROGRAMS - 1, wide) == BLOCK
    assert tiered.columns(WIDE_MIN_PROGRAMS // 2, wide + 1) == wide  # two programs a row
    assert VARIANTS["triton-word"].columns(10_000, 151_936) == BLOCK  # never widens
