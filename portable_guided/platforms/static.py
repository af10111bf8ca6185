"""The fallback for any device without a kernel of its own (``mps``, ``hpu``, custom
devices): static shapes, the logits never travel to the host."""

from __future__ import annotations

from ..platform import Platform
from ._devices import missing

PLATFORM = Platform(
    name="static",
    description="any other device: host-built bitmask, one transfer, static-shape graph",
    device_types=(),
    kernels={
        "torch": "portable_guided.kernels.static_torch:apply_static_torch",
        "paddle": "portable_guided.kernels.static_paddle:apply_static_paddle",
    },
    strategy="static shapes",
    static_shapes=True,
    # No device of its own: checked on host tensors (forced with platform="static"), and
    # synchronized like any eager device when it serves one.
    hooks={
        "probe": "portable_guided.platforms.static:probe",
        "to_device": "portable_guided.platforms._devices:on_host",
        "synchronize": "portable_guided.platforms._devices:synchronize",
    },
)


def probe(framework: str) -> str | None:
    """The static kernels run on host tensors, so only the framework can be missing."""
    return missing(framework)
