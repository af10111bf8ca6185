"""CUDA/ROCm: the in-place kernel for Torch and Paddle GPU logits.

Skipped without a GPU; run whenever one is present (results go under bench/results/).
"""

from __future__ import annotations

import numpy as np
import pytest

import portable_guided as pg
from portable_guided import reference_apply_token_mask as reference
from tests.support import cuda_available, device_missing, make, to_f32

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(not cuda_available(), reason="no CUDA/ROCm device visible to torch"),
]


def _paddle_gpu() -> bool:
    return device_missing("cuda", "paddle") is None


def _case(rng, batch=5, width=50_000, dense_rows=(1,)):
    words = -(-width // 32)
    bitmask = np.zeros((batch, words), np.int32)
    for row in range(batch):
        bitmask[row, rng.integers(0, words, 20)] = rng.integers(1, 2**31, 20)
    for row in dense_rows:
        bitmask[row] = rng.integers(-(2**31), 2**31, words, dtype=np.int64).astype(np.int32)
    return rng.standard_normal((batch, width + 7)).astype(np.float32), bitmask


KERNELS = ["triton", "triton-word", "triton-dense", "triton-element", "triton-tiered",
           "xgrammar-triton", "xgrammar-cuda"]


def test_every_kernel_is_tested():
    from portable_guided.kernels.cuda import KERNELS as DEFINED

    assert sorted(DEFINED) == sorted(KERNELS)


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("bitmask_on", ["cpu", "cuda"])
@pytest.mark.parametrize("indices", [None, [3, 0], "tensor"])
@pytest.mark.parametrize("kernel", KERNELS)
def test_torch_matches_reference(dtype, bitmask_on, indices, kernel, monkeypatch):
    import torch

    if kernel.startswith("xgrammar"):
        pytest.importorskip("xgrammar")
    monkeypatch.setenv("PORTABLE_GUIDED_CUDA_KERNEL", kernel)
    rng = np.random.default_rng(1)
    values, bitmask = _case(rng)
    wide = make(values, "torch", dtype, device="cuda")
    logits = wide[:, 3:-4]  # strided rows, not 16-byte aligned: always the Triton kernel
    if kernel == "xgrammar-cuda" and indices is None:
        logits = wide[:, 8:-4]  # aligned first row, odd row stride: its scalar path
    elif kernel == "xgrammar-cuda" and indices == "tensor":
        logits = wide[:, :-7].contiguous()  # row stride a multiple of 4: its float4 path
    before = to_f32(logits)
    index_arg = torch.tensor([3, 0], device="cuda") if indices == "tensor" else indices
    index_list = [3, 0] if indices else None
    expected = reference(before, bitmask, indices=index_list)
    resolution = pg.resolve(logits)
    assert resolution.platform.name == "cuda" and resolution.strategy == "in-place kernel"
    out = pg.apply_token_mask(logits, make(bitmask, "torch", device=bitmask_on),
                              indices=index_arg)
    assert out is logits
    np.testing.assert_array_equal(to_f32(logits), expected)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("vocab_size", [1000, 997])
@pytest.mark.parametrize("kernel", KERNELS)
def test_torch_vocab_size_with_a_wider_bitmask(dtype, vocab_size, kernel, monkeypatch):
    """A bitmask wider than the vocabulary and a vocab_size that ends inside a 16-byte group
    (997): xgrammar's CUDA kernel would write past it, so that call must take ours."""
    import torch

    import portable_guided.kernels.cuda as cuda_kernels

    if kernel.startswith("xgrammar"):
        pytest.importorskip("xgrammar")
    monkeypatch.setenv("PORTABLE_GUIDED_CUDA_KERNEL", kernel)
    calls = []
    real = cuda_kernels._xgrammar_cuda_kernel
    monkeypatch.setattr(cuda_kernels, "_xgrammar_cuda_kernel",
                        lambda: (calls.append(1), real())[1])
    rng = np.random.default_rng(4)
    values = rng.standard_normal((4, 1024)).astype(np.float32)
    bitmask = rng.integers(-2**31, 2**31, (4, 40), dtype=np.int64).astype(np.int32)
    logits = make(values, "torch", dtype, device="cuda")
    expected = reference(to_f32(logits), bitmask, vocab_size=vocab_size)
    pg.apply_token_mask(logits, torch.from_numpy(bitmask).cuda(), vocab_size=vocab_size)
    np.testing.assert_array_equal(to_f32(logits), expected)
    assert len(calls) == (kernel == "xgrammar-cuda" and vocab_size == 1000)


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("width", [1, 31, 1000, 2048, 2049, 49152, 151936])
def test_plain_call_matches_reference_on_both_launches(dtype, width, monkeypatch):
    """The plain call (2-D logits, device bitmask, nothing else) takes the fast path; its first
    call per specialization launches through Triton, later ones through the compiled kernel.
    Alternating aligned and unaligned rows and row strides must not reuse a kernel compiled
    for the other (Triton specializes on 16-byte alignment)."""
    import torch

    import portable_guided.kernels.cuda as cuda_kernels
    from portable_guided.kernels import triton_mask

    taken = []
    real = cuda_kernels.apply_plain_cuda
    monkeypatch.setattr(cuda_kernels, "apply_plain_cuda",
                        lambda logits, bitmask: taken.append(real(logits, bitmask)) or taken[-1])
    monkeypatch.setattr("portable_guided.apply._PLAIN", {})
    rng = np.random.default_rng(width)
    words = -(-width // 32)
    pg.resolve(make(np.zeros((1, 1), np.float32), "torch", device="cuda"))  # as a loop would
    for offset, extra in [(0, 0), (3, 5), (0, 0), (3, 5), (0, 16), (0, 16)]:
        bitmask = rng.integers(-2**31, 2**31, (3, words), dtype=np.int64).astype(np.int32)
        bitmask[0, : words // 2] = 0
        bitmask[1, : words // 2] = -1
        values = rng.standard_normal((3, width + offset + extra)).astype(np.float32)
        logits = make(values, "torch", dtype, device="cuda")[:, offset : offset + width]
        expected = reference(to_f32(logits), bitmask)
        pg.apply_token_mask(logits, torch.from_numpy(bitmask).cuda())
        np.testing.assert_array_equal(to_f32(logits), expected)
    assert taken == [True] * 6
    assert any(key[0] is triton_mask.VARIANTS[triton_mask.DEFAULT_VARIANT].kernel
               for key in triton_mask._compiled)
    # Repeated specializations were launched by the plain launch (pointers as integers).
    assert any(key[0] == getattr(torch, dtype) for key in triton_mask._plain_launches)


def test_plain_call_does_not_synchronize():
    import torch

    rng = np.random.default_rng(3)
    values, bitmask = _case(rng, batch=8)
    logits = make(values, "torch", "bfloat16", device="cuda")[:, :50_000]
    mask = torch.from_numpy(bitmask).cuda()
    pg.apply_token_mask(logits, mask)  # warm: Triton compile
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        for _ in range(3):
            pg.apply_token_mask(logits, mask)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    torch.cuda.synchronize()


def test_large_host_bitmask_is_staged_by_the_thread_pool():
    """A host bitmask above PARALLEL_COPY_MIN_WORDS is copied into pinned memory by Torch;
    the result is the reference's."""
    import torch

    from portable_guided.kernels.cuda import PARALLEL_COPY_MIN_WORDS

    rng = np.random.default_rng(5)
    batch, width = 16, 151_936
    words = -(-width // 32)
    assert batch * words >= PARALLEL_COPY_MIN_WORDS
    bitmask = rng.integers(-2**31, 2**31, (batch, words), dtype=np.int64).astype(np.int32)
    values = rng.standard_normal((batch, width)).astype(np.float32)
    logits = make(values, "torch", device="cuda")
    expected = reference(values, bitmask, indices=list(range(0, batch, 2)))
    pg.apply_token_mask(logits, torch.from_numpy(bitmask), indices=list(range(0, batch, 2)))
    np.testing.assert_array_equal(to_f32(logits), expected)


def test_torch_host_bitmask_call_does_not_synchronize():
    import torch

    rng = np.random.default_rng(2)
    values, bitmask = _case(rng, batch=8)
    logits = make(values, "torch", device="cuda")
    host = torch.from_numpy(bitmask)
    pg.apply_token_mask(logits, host)  # warm: staging buffers, Triton compile
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        for _ in range(3):
            pg.apply_token_mask(logits, host, indices=[0, 5])
    finally:
        torch.cuda.set_sync_debug_mode("default")
    torch.cuda.synchronize()


@pytest.mark.skipif(not _paddle_gpu(), reason="paddle is not built with CUDA or sees no GPU")
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_paddle_gpu_in_place_zero_copy(dtype):
    import paddle

    rng = np.random.default_rng(3)
    values, bitmask = _case(rng)
    logits = make(values, "paddle", dtype, device="cuda")
    pointer = logits.data_ptr()
    expected = reference(to_f32(logits), bitmask)
    # Work queued on Paddle's stream before the call must be ordered before the mask.
    logits.scale_(1.0)
    out = pg.apply_token_mask(logits, bitmask)
    assert out is logits and logits.data_ptr() == pointer
    paddle.device.synchronize()
    np.testing.assert_array_equal(to_f32(logits), expected)
