"""The compiled CPU kernel (``portable_guided/kernels/_cpu_mask.c``) against the NumPy reference.

Whole-pipeline parity for every framework is in test_parity.py; here the extension itself:
each kind of bitmask word, every tail length, thread splits that cut rows, strided rows, a
bitmask row per logits row given separately, bad input, and the OpenMP runtime it joins.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

from portable_guided import reference_apply_token_mask as reference

try:
    from portable_guided.kernels import _cpu_mask
except ImportError:
    _cpu_mask = None

compiler = shutil.which(os.environ.get("CC", "cc")) or shutil.which("gcc")
needs_kernel = pytest.mark.skipif(_cpu_mask is None, reason="compiled kernel not built")
NEG = {np.float32: 0xFF800000, np.float16: 0xFC00}
BITS = {np.float32: np.uint32, np.float16: np.uint16}


@pytest.mark.skipif(compiler is None, reason="no C compiler: the package installs without it")
def test_built_where_a_compiler_is_found():
    """A C compiler was there at install, so the extension must be too (else CI would test
    only the NumPy fallback)."""
    assert _cpu_mask is not None


def _words(rng: np.random.Generator, rows: int, words: int) -> np.ndarray:
    """Rows mixing every kind of word: all allowed, all blocked, 1 to 31 blocked, random."""
    kinds = rng.integers(0, 4, (rows, words))
    out = rng.integers(0, 2**32, (rows, words), dtype=np.uint64).astype(np.uint32)
    out[kinds == 0] = 0xFFFFFFFF
    out[kinds == 1] = 0
    few = kinds == 2
    cleared = rng.integers(1, 32, few.sum())
    out[few] = [np.uint32(0xFFFFFFFF) & ~np.uint32(sum(1 << int(b) for b in
                                                      rng.choice(32, n, replace=False)))
                for n in cleared]
    return out


def _mask(values, words, rows, bitmask_rows, vocab, threads):
    bits = values.view(BITS[values.dtype.type])
    _cpu_mask.mask_rows(bits, words, np.asarray(rows, np.int64),
                        np.asarray(bitmask_rows, np.int64), vocab, NEG[values.dtype.type],
                        threads)


@needs_kernel
@pytest.mark.parametrize("dtype", [np.float32, np.float16])
@pytest.mark.parametrize("threads", [1, 2, 3, 0])
@pytest.mark.parametrize("vocab", [1, 31, 32, 33, 1000, 4097])
def test_matches_reference(dtype, threads, vocab):
    rng = np.random.default_rng(vocab * 7 + threads)
    batch, width = 5, vocab + 9  # columns past vocab stay as they are
    words = _words(rng, batch, -(-vocab // 32) + 1)  # a wider bitmask than needed
    values = rng.standard_normal((batch, width)).astype(dtype)
    expected = reference(values.astype(np.float32), words.view(np.int32), vocab_size=vocab)
    _mask(values, words, range(batch), range(batch), vocab, threads)
    np.testing.assert_array_equal(values.astype(np.float32), expected)


@needs_kernel
@pytest.mark.parametrize("threads", [1, 2, 3, 7])
def test_rows_split_inside_and_across_rows(threads):
    """Threads split the rows' words evenly, so a part may start or stop inside a row or at
    its tail word; every part boundary must mask exactly once."""
    rng = np.random.default_rng(threads)
    vocab = 3 * 32 + 5
    words = _words(rng, 7, 4)
    values = rng.standard_normal((7, vocab)).astype(np.float32)
    expected = reference(values, words.view(np.int32))
    _mask(values, words, range(7), range(7), vocab, threads)
    np.testing.assert_array_equal(values, expected)


@needs_kernel
def test_bitmask_rows_given_separately_and_strided_logits():
    """Row i of the logits is masked by row ``bitmask_rows[i]``; rows of a wider buffer (a
    strided view) keep the columns past the view."""
    rng = np.random.default_rng(3)
    vocab, width = 200, 230
    buffer = rng.standard_normal((6, width + 11)).astype(np.float32)
    view = buffer[:, :width]
    words = _words(rng, 3, -(-vocab // 32))
    rows, bitmask_rows = [4, 0, 2], [1, 2, 0]
    expected = buffer.copy()
    for row, mask_row in zip(rows, bitmask_rows):
        expected[row, :width] = reference(view[row], words[mask_row].view(np.int32),
                                          vocab_size=vocab)
    _mask(view, words, rows, bitmask_rows, vocab, 1)
    np.testing.assert_array_equal(buffer, expected)


@needs_kernel
@pytest.mark.parametrize("call,error,message", [
    (lambda b, w: _cpu_mask.mask_rows(b, w, np.arange(2), np.arange(3), 64, 0), ValueError,
     "rows and bitmask_rows differ in length: 2 vs 3"),
    (lambda b, w: _cpu_mask.mask_rows(b, w, np.array([0, 5]), np.arange(2), 64, 0),
     IndexError, r"row pair 1 is \(5, 1\), outside the 4 logits rows and 4 bitmask rows"),
    (lambda b, w: _cpu_mask.mask_rows(b, w, np.arange(2), np.arange(2), 65, 0), ValueError,
     r"vocab 65 must be in \[0, 64\] \(logits columns\) and at most 64 \(bitmask bits\)"),
    (lambda b, w: _cpu_mask.mask_rows(b, w, np.arange(2, dtype=np.int32), np.arange(2), 64,
                                      0), TypeError, "rows must be a contiguous 1-D int64"),
    (lambda b, w: _cpu_mask.mask_rows(b.astype(np.uint64), w, np.arange(2), np.arange(2), 64,
                                      0), ValueError, "2- or 4-byte items"),
    (lambda b, w: _cpu_mask.mask_rows(b[:, ::2], w, np.arange(2), np.arange(2), 32, 0),
     ValueError, "contiguous columns"),
    (lambda b, w: _cpu_mask.mask_rows(b, w, np.arange(2), np.arange(2), 64, 0, -1), ValueError,
     "threads must be >= 0, got -1"),
])
def test_bad_input_raises_and_writes_nothing(call, error, message):
    bits = np.arange(4 * 64, dtype=np.uint32).reshape(4, 64)
    words = np.zeros((4, 2), np.uint32)
    with pytest.raises(error, match=message):
        call(bits, words)
    np.testing.assert_array_equal(bits, np.arange(4 * 64, dtype=np.uint32).reshape(4, 64))


@needs_kernel
def test_read_only_logits_are_refused():
    bits = np.zeros((2, 32), np.uint32)
    bits.flags.writeable = False
    with pytest.raises(ValueError, match="read-only"):
        _cpu_mask.mask_rows(bits, np.zeros((2, 1), np.uint32), np.arange(2), np.arange(2), 32,
                            0)


def test_unknown_kernel_choice_raises(monkeypatch):
    from portable_guided.kernels import compiled

    monkeypatch.setenv(compiled.KERNEL_ENV_VAR, "fast")
    with pytest.raises(ValueError, match="must be 'compiled' or 'numpy', got 'fast'"):
        compiled.available()


def _in_fresh_process(code: str) -> str:
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120, check=True)
    return done.stdout.strip()


@needs_kernel
@pytest.mark.torch
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Torch's Linux wheels bundle "
                    "libgomp; other builds may use another runtime or none")
def test_joins_the_openmp_runtime_torch_loaded():
    """No runtime before Torch is imported (nothing is linked), Torch's libgomp after."""
    code = ("from portable_guided.kernels import _cpu_mask as k; print(k.openmp_runtime()); "
            "import torch; print(k.openmp_runtime())")
    before, after = _in_fresh_process(code).splitlines()
    assert (before, after) == ("None", "libgomp.so.1")
