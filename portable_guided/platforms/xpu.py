"""Intel XPU (``torch.xpu``) and Paddle XPU (Kunlun): static shapes."""

from __future__ import annotations

from ..platform import Platform
from ._static import STATIC_KERNELS

PLATFORM = Platform(
    name="xpu",
    description="Intel torch.xpu and Paddle XPU: host-built bitmask, one transfer, static graph",
    device_types=("xpu",),
    kernels=STATIC_KERNELS,
    strategy="static shapes",
    static_shapes=True,
)
