"""Intel XPU (``torch.xpu``) and Paddle XPU (Baidu Kunlun): static shapes."""

from __future__ import annotations

from typing import Any

from ..platform import Platform
from ._devices import missing

PLATFORM = Platform(
    name="xpu",
    description="Intel torch.xpu and Paddle XPU: host-built bitmask, one transfer, static graph",
    device_types=("xpu",),
    kernels={
        "torch": "portable_guided.kernels.static_torch:apply_static_torch",
        "paddle": "portable_guided.kernels.static_paddle:apply_static_paddle",
    },
    strategy="static shapes",
    static_shapes=True,
    hooks={
        "probe": "portable_guided.platforms.xpu:probe",
        "to_device": "portable_guided.platforms.xpu:to_device",
        "synchronize": "portable_guided.platforms._devices:synchronize",
    },
)


def probe(framework: str) -> str | None:
    """An Intel XPU visible to Torch, or a Kunlun XPU visible to an XPU build of Paddle."""
    why = missing(framework)
    if why:
        return why
    if framework == "torch":
        import torch

        if hasattr(torch, "xpu") and torch.xpu.is_available():
            return None
        return "no Intel XPU visible to torch (torch.xpu.is_available() is false)"
    import paddle

    # Paddle's XPUPlace is Baidu Kunlun, not an Intel GPU.
    if not paddle.device.is_compiled_with_xpu():
        return "paddle is not built for XPU (Baidu Kunlun; install paddlepaddle-xpu)"
    if paddle.device.xpu.device_count() == 0:
        return "no XPU (Baidu Kunlun) visible to paddle"
    return None


def to_device(array: Any, framework: str) -> Any:
    """``array`` on XPU 0."""
    if framework == "torch":
        import torch

        return torch.from_numpy(array).to("xpu")
    import paddle

    return paddle.to_tensor(array, place=paddle.XPUPlace(0))
