"""XLA (TPU, and torch_xla on any PJRT device): static shapes, one graph per logits shape."""

from __future__ import annotations

from ..platform import Platform
from ._static import STATIC_KERNELS

PLATFORM = Platform(
    name="xla",
    description="torch_xla / TPU: host-built bitmask, one transfer, precompiled graphs",
    device_types=("xla",),
    kernels={"torch": STATIC_KERNELS["torch"]},
    strategy="static shapes",
    static_shapes=True,
    install_hints={"torch": "pip install 'portable-guided[xla]' (torch_xla matching torch)"},
)
