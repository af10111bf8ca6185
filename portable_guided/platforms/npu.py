"""Ascend NPU (``torch_npu``, Paddle custom device ``npu``): static shapes."""

from __future__ import annotations

from ..platform import Platform
from ._static import STATIC_KERNELS

PLATFORM = Platform(
    name="npu",
    description="Ascend NPU (torch_npu, Paddle custom device): static shapes",
    device_types=("npu",),
    kernels=STATIC_KERNELS,
    strategy="static shapes",
    static_shapes=True,
    install_hints={"torch": "pip install torch_npu matching your torch"},
)
