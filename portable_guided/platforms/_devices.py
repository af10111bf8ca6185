"""Hooks several built-in platforms share: is a framework installed, host tensors, eager sync.

Frameworks are imported inside the functions, so a platform module that names these hooks
stays free of framework imports.
"""

from __future__ import annotations

import importlib.util
from typing import Any

from .._frameworks import framework_of

__all__ = ["missing", "on_host", "synchronize"]


def missing(module: str) -> str | None:
    """``"<module> is not installed"`` when it cannot be imported here, else ``None``.

    Looks the module up without importing it, so a probe stays cheap and never raises.
    """
    return None if importlib.util.find_spec(module) else f"{module} is not installed"


def on_host(array: Any, framework: str) -> Any:
    """``array`` as a ``framework`` tensor in host memory (Torch shares the array's memory)."""
    if framework == "numpy":
        return array
    if framework == "torch":
        import torch

        return torch.from_numpy(array)
    if framework == "paddle":
        import paddle

        return paddle.to_tensor(array, place=paddle.CPUPlace())
    raise ValueError(f"unknown framework {framework!r}; expected torch, paddle or numpy")


def synchronize(tensor: Any) -> None:
    """Wait for the work queued on an eager device: ``torch.<device type>.synchronize()`` for
    Torch (CUDA, XPU, NPU, MPS...), ``paddle.device.synchronize()`` for Paddle off the CPU."""
    framework = framework_of(tensor)
    if framework == "torch":
        import torch

        backend = getattr(torch, tensor.device.type, None)
        if backend is not None and hasattr(backend, "synchronize"):
            backend.synchronize()
    elif framework == "paddle" and not tensor.place.is_cpu_place():
        import paddle

        paddle.device.synchronize()
