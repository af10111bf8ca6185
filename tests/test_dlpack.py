"""Zero-copy views: write through one, read through the other, same memory."""

import numpy as np
import pytest

from portable_guided.dlpack import host_array, host_bits, to_paddle, to_torch
from tests.support import HAS_PADDLE, HAS_TORCH, framework_params, make, to_f32

needs_torch = pytest.mark.skipif(not HAS_TORCH, reason="torch is not installed")
needs_paddle = pytest.mark.skipif(not HAS_PADDLE, reason="paddle is not installed")


@pytest.mark.paddle
@pytest.mark.torch
@needs_torch
@needs_paddle
@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_paddle_to_torch_shares_memory(dtype):
    import torch

    wide = make(np.zeros((3, 10), np.float32), "paddle", dtype)
    view = wide[:, 2:7]  # a strided view
    tensor = to_torch(view)
    assert tensor.data_ptr() == view.data_ptr()
    tensor[1, 0] = 5.0
    assert float(wide[1, 2].astype("float32")) == 5.0
    view[2, 4] = -3.0  # and the other way round
    assert tensor[2, 4].item() == -3.0
    assert tensor.dtype == getattr(torch, dtype)


@pytest.mark.paddle
@pytest.mark.torch
@needs_torch
@needs_paddle
def test_torch_to_paddle_shares_memory():
    import torch

    tensor = torch.zeros(4, 6, dtype=torch.bfloat16)
    view = to_paddle(tensor)
    assert view.data_ptr() == tensor.data_ptr()
    view[0, 1] = 2.0
    assert tensor[0, 1].item() == 2.0


@pytest.mark.torch
@needs_torch
def test_numpy_to_torch_shares_memory():
    array = np.zeros((2, 5), np.float32)
    tensor = to_torch(array)
    tensor[1, 3] = 7.0
    assert array[1, 3] == 7.0 and tensor.data_ptr() == array.ctypes.data


@pytest.mark.parametrize("framework", framework_params())
@pytest.mark.parametrize("dtype,pattern", [("float32", 0xFF800000), ("float16", 0xFC00)])
def test_host_bits_writes_reach_the_tensor(framework, dtype, pattern):
    wide = make(np.ones((2, 8), np.float32), framework, dtype)
    view = wide[:, 1:5]
    bits = host_bits(view)
    bits[0, 0] = pattern  # -inf
    values = np.asarray(wide.tolist() if framework != "numpy" else wide, dtype=np.float32)
    assert values[0, 1] == -np.inf and np.isfinite(np.delete(values.ravel(), 1)).all()


@pytest.mark.parametrize("framework", framework_params())
@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_host_array_shares_memory_with_the_same_item_size(framework, dtype):
    """The compiled kernel's view: writes through it reach the tensor and back, no copy."""
    if framework == "numpy" and dtype == "bfloat16":
        pytest.skip("numpy has no bfloat16")
    tensor = make(np.zeros((2, 3), np.float32), framework, dtype)
    array = host_array(tensor, framework, dtype)
    assert array.shape == (2, 3)
    assert array.itemsize == (4 if dtype == "float32" else 2)
    unsigned = array.view(np.uint32 if array.itemsize == 4 else np.uint16)
    unsigned[1, 2] = {"float32": 0xFF800000, "float16": 0xFC00, "bfloat16": 0xFF80}[dtype]
    assert np.isneginf(to_f32(tensor)[1, 2])  # our write reached the tensor
    one = {"float32": 0x3F800000, "float16": 0x3C00, "bfloat16": 0x3F80}[dtype]
    host_bits(tensor, framework, dtype)[0, 0] = one  # a write through another view...
    assert unsigned[0, 0] == one  # ...is seen through ours


@pytest.mark.torch
def test_host_array_of_logits_that_require_grad():
    torch = pytest.importorskip("torch")
    leaf = torch.zeros(2, 4, requires_grad=True)
    logits = leaf * 1  # a forward's output: requires grad, not a leaf
    host_array(logits, "torch", "float32")[0, 1] = -np.inf
    assert logits[0, 1].item() == -np.inf
