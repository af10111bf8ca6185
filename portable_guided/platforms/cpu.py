"""CPU: the vectorized NumPy kernel, in place, for Torch, Paddle and NumPy logits."""

from __future__ import annotations

from ..platform import Platform
from ._devices import missing

PLATFORM = Platform(
    name="cpu",
    description="host memory: vectorized NumPy kernel on zero-copy views",
    device_types=("cpu",),
    kernels={
        "torch": "portable_guided.kernels.host:apply_host",
        "paddle": "portable_guided.kernels.host:apply_host",
        "numpy": "portable_guided.kernels.host:apply_host",
    },
    strategy="vectorized in place",
    # Host work is done when the call returns: nothing to synchronize or flush.
    hooks={
        "probe": "portable_guided.platforms.cpu:probe",
        "to_device": "portable_guided.platforms._devices:on_host",
    },
)


def probe(framework: str) -> str | None:
    """Host memory is always there: only the framework can be missing."""
    return None if framework == "numpy" else missing(framework)
