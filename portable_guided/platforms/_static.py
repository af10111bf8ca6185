"""The kernels shared by every static-shape platform."""

from __future__ import annotations

STATIC_KERNELS = {
    "torch": "portable_guided.kernels.static_torch:apply_static_torch",
    "paddle": "portable_guided.kernels.static_paddle:apply_static_paddle",
}
