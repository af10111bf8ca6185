"""CUDA and ROCm: xgrammar's Triton kernel in place; Paddle through zero-copy DLPack."""

from __future__ import annotations

from ..platform import Platform

_HINT = "pip install 'portable-guided[grammar]' triton (xgrammar's Triton kernel)"

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
)
