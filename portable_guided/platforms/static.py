"""The fallback for any device without a kernel of its own (``mps``, ``hpu``, custom
devices): static shapes, the logits never travel to the host."""

from __future__ import annotations

from ..platform import Platform
from ._static import STATIC_KERNELS

PLATFORM = Platform(
    name="static",
    description="any other device: host-built bitmask, one transfer, static-shape graph",
    device_types=(),
    kernels=STATIC_KERNELS,
    strategy="static shapes",
    static_shapes=True,
)
