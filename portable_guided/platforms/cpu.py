"""CPU: the vectorized NumPy kernel, in place, for Torch, Paddle and NumPy logits."""

from __future__ import annotations

from ..platform import Platform

_HOST = "portable_guided.kernels.host:apply_host"

PLATFORM = Platform(
    name="cpu",
    description="host memory: vectorized NumPy kernel on zero-copy views",
    device_types=("cpu",),
    kernels={"torch": _HOST, "paddle": _HOST, "numpy": _HOST},
    strategy="vectorized in place",
)
