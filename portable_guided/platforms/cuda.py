"""CUDA and ROCm: our Triton kernel in place; Paddle through zero-copy DLPack."""

from __future__ import annotations

from typing import Any

from ..platform import Platform
from ._devices import missing

_HINT = "pip install triton (the in-place Triton kernel)"

PLATFORM = Platform(
    name="cuda",
    description="NVIDIA CUDA / AMD ROCm GPUs (Torch, Paddle GPU via DLPack)",
    device_types=("cuda",),
    kernels={
        "torch": "portable_guided.kernels.cuda:apply_cuda_torch",
        "paddle": "portable_guided.kernels.cuda:apply_cuda_paddle",
    },
    strategy="in-place kernel",
    install_hints={"torch": _HINT, "paddle": _HINT + " and torch"},
    hooks={
        "probe": "portable_guided.platforms.cuda:probe",
        "to_device": "portable_guided.platforms.cuda:to_device",
        "synchronize": "portable_guided.platforms._devices:synchronize",
    },
)


def probe(framework: str) -> str | None:
    """A GPU visible to Torch (CUDA or ROCm build), or to a CUDA build of Paddle."""
    why = missing(framework)
    if why:
        return why
    if framework == "torch":
        import torch

        return None if torch.cuda.is_available() else "no CUDA/ROCm device visible to torch"
    import paddle

    if not paddle.device.is_compiled_with_cuda():
        return "paddle is not built with CUDA (install paddlepaddle-gpu)"
    if paddle.device.cuda.device_count() == 0:
        return "no GPU visible to paddle"
    return None


def to_device(array: Any, framework: str) -> Any:
    """``array`` on GPU 0."""
    if framework == "torch":
        import torch

        return torch.from_numpy(array).cuda()
    import paddle

    return paddle.to_tensor(array, place=paddle.CUDAPlace(0))
