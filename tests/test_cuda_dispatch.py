"""Which CUDA kernel a call takes is decided on the host, so it is checked here on CPU tensors
(the kernels themselves run in tests/test_cuda.py on a GPU and tests/test_triton_mask.py under
Triton's interpreter)."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

from portable_guided.kernels.cuda import _fits_xgrammar_cuda, fill_end_to_end


@pytest.mark.parametrize(("dtype", "width", "vocab", "fits"), [
    # rows whose stride is a multiple of the 16-byte group: the vocabulary must end a group,
    # else xgrammar's kernel writes -inf past it
    ("float32", 64, 32, True), ("float32", 64, 30, False),
    ("bfloat16", 64, 40, True), ("bfloat16", 64, 44, False),
    # an odd row stride takes its one-element path: any vocabulary
    ("float32", 63, 30, True), ("float16", 61, 45, True),
])
def test_xgrammar_cuda_kernel_only_where_it_masks_exactly_vocab_size(dtype, width, vocab, fits):
    table = torch.zeros(3, width, dtype=getattr(torch, dtype))
    assert _fits_xgrammar_cuda(table, vocab) is fits


def test_xgrammar_cuda_kernel_not_for_rows_that_start_unaligned():
    wide = torch.zeros(2, 67, dtype=torch.float32)
    assert not _fits_xgrammar_cuda(wide[:, 1:], 64)  # 4 bytes past an aligned start
    assert _fits_xgrammar_cuda(wide[:, 4:], 60) is (wide[:, 4:].data_ptr() % 16 == 0)


def test_host_bitmask_and_rows_are_staged_end_to_end_in_one_copy_each():
    """The pinned staging buffer receives the bitmask (any strides) and then the row indices,
    exactly as a concatenation would lay them out, without building the concatenation."""
    wide = np.arange(5 * 7, dtype=np.int32).reshape(5, 7)
    bitmask = wide[:, 1:4]  # strided: a column slice of a wider array
    rows = np.array([4, 0, 2], np.int32)
    target = np.full(bitmask.size + rows.size, -7, np.int32)
    fill_end_to_end(target, [bitmask, rows])
    np.testing.assert_array_equal(target, np.concatenate([bitmask.reshape(-1), rows]))
    with pytest.raises(ValueError, match="parts hold 15 elements for a target of 18"):
        fill_end_to_end(target, [bitmask])


def test_env_may_be_set_follows_the_environment(monkeypatch):
    from portable_guided.kernels import env_may_be_set

    name = "PORTABLE_GUIDED_TEST_ENV_PROBE"
    monkeypatch.delenv(name, raising=False)
    assert not env_may_be_set(name)
    monkeypatch.setenv(name, "")  # an empty value counts as set: the general path reads it
    assert env_may_be_set(name)
    monkeypatch.setenv(name, "x")
    assert env_may_be_set(name)
    monkeypatch.delenv(name)
    assert not env_may_be_set(name)
