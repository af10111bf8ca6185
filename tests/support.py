"""Test helpers: build test tensors in every framework and read them back as float32."""

from __future__ import annotations

import contextlib
import importlib.util
import os
from collections.abc import Iterator

import numpy as np
import pytest

from portable_guided import get_platform
from portable_guided._frameworks import dtype_name
from portable_guided.registry import REGISTRY

HAS_TORCH = importlib.util.find_spec("torch") is not None
HAS_PADDLE = importlib.util.find_spec("paddle") is not None
HAS_XGRAMMAR = importlib.util.find_spec("xgrammar") is not None


def device_missing(platform: str, framework: str) -> str | None:
    """Why ``framework`` logits cannot go on ``platform``'s device here (the platform's probe),
    or ``None`` when they can."""
    return get_platform(platform).probe(framework)


def cuda_available() -> bool:
    """A CUDA/ROCm GPU visible to Torch."""
    return device_missing("cuda", "torch") is None


def frameworks() -> list[str]:
    """Frameworks installed here."""
    return ["numpy"] + (["torch"] if HAS_TORCH else []) + (["paddle"] if HAS_PADDLE else [])


def framework_params(include_numpy: bool = True) -> list:
    """Frameworks installed here as pytest params, marked ``torch``/``paddle`` so each CI lane
    selects its own."""
    params = [pytest.param("numpy", id="numpy")] if include_numpy else []
    if HAS_TORCH:
        params.append(pytest.param("torch", id="torch", marks=pytest.mark.torch))
    if HAS_PADDLE:
        params.append(pytest.param("paddle", id="paddle", marks=pytest.mark.paddle))
    return params


def make(array: np.ndarray, framework: str, dtype: str | None = None, device: str = "cpu"):
    """A tensor of ``framework`` holding ``array`` (cast to ``dtype``), on the device of type
    ``device`` (put there by the platform that claims it)."""
    dtype = dtype or str(array.dtype)
    if framework == "numpy":
        if device != "cpu":
            raise ValueError(f"NumPy arrays live on the cpu, not on {device!r}")
        return np.ascontiguousarray(array, dtype=dtype)
    tensor = REGISTRY.for_device(device).to_device(np.ascontiguousarray(array), framework)
    return cast(tensor, framework, dtype)


def cast(tensor, framework: str, dtype: str):
    """``tensor`` converted to ``dtype`` (a name: ``bfloat16``...), itself if already so."""
    if framework == "numpy":
        return np.ascontiguousarray(tensor, dtype=dtype)
    if framework == "torch":
        import torch

        return tensor.to(dtype=getattr(torch, dtype))
    return tensor if dtype_name(tensor, framework) == dtype else tensor.astype(dtype)


def to_f32(x) -> np.ndarray:
    """Values of any framework's float tensor as a float32 NumPy array (a copy)."""
    if isinstance(x, np.ndarray):
        return x.astype(np.float32)
    if type(x).__module__.startswith("torch"):
        return x.detach().float().cpu().numpy()
    if type(x).__module__.startswith("jax"):
        return np.asarray(x.astype("float32"))
    return x.astype("float32").cpu().numpy()


def skip_unless(name: str) -> pytest.MarkDecorator:
    return pytest.mark.skipif(
        importlib.util.find_spec(name) is None, reason=f"{name} is not installed"
    )


def padded_rows(rows: list[list[int]]) -> tuple[np.ndarray, list[int]]:
    """Token rows of different lengths as one zero-padded int64 array plus each row's count."""
    counts = [len(r) for r in rows]
    ids = np.zeros((len(rows), max(counts)), dtype=np.int64)
    for i, r in enumerate(rows):
        ids[i, : len(r)] = r
    return ids, counts


@contextlib.contextmanager
def cpu_kernel(kernel: str | None) -> Iterator[None]:
    """Run the CPU platform on ``kernel`` ("compiled" or "numpy"; None leaves the choice
    alone). "compiled" skips where the extension was not built (no C compiler at install);
    tests/test_compiled.py fails instead when a compiler is there."""
    if kernel is None:
        yield
        return
    if kernel == "compiled" and importlib.util.find_spec(
            "portable_guided.kernels._cpu_mask") is None:
        pytest.skip("the compiled CPU kernel is not built (no C compiler at install time)")
    name = "PORTABLE_GUIDED_CPU_KERNEL"
    saved = os.environ.get(name)
    os.environ[name] = kernel
    try:
        yield
    finally:
        if saved is None:
            del os.environ[name]
        else:
            os.environ[name] = saved
