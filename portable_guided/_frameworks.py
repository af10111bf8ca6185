"""Recognize tensors of Torch, Paddle, JAX and NumPy without importing any of them.

A tensor can only come from a framework that is already imported, so looking the framework
up in ``sys.modules`` keeps ``import portable_guided`` light.
"""

from __future__ import annotations

import sys
from typing import Any

__all__ = ["FRAMEWORKS", "framework_of", "device_type_of", "dtype_name"]

FRAMEWORKS = ("torch", "paddle", "jax", "numpy")


def framework_of(x: Any) -> str:
    """Return ``"torch"``, ``"paddle"``, ``"jax"`` or ``"numpy"`` for a tensor of that
    framework."""
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(x, torch.Tensor):
        return "torch"
    paddle = sys.modules.get("paddle")
    if paddle is not None and isinstance(x, paddle.Tensor):
        return "paddle"
    jax = sys.modules.get("jax")
    if jax is not None and isinstance(x, jax.Array):
        return "jax"
    numpy = sys.modules.get("numpy")
    if numpy is not None and isinstance(x, numpy.ndarray):
        return "numpy"
    raise TypeError(
        f"expected a torch.Tensor, paddle.Tensor, jax.Array or numpy.ndarray, got "
        f"{type(x).__module__}."
        f"{type(x).__qualname__}"
    )


def device_type_of(x: Any, framework: str) -> str:
    """The device family holding ``x``: ``cpu``, ``cuda`` (also ROCm and Paddle GPU), ``xla``,
    ``xpu``, ``npu`` or whatever name the framework reports for other devices.

    JAX arrays report ``jax:<backend>`` (``jax:cpu``, ``jax:tpu``, ``jax:gpu``): JAX has its
    own kernels, so its devices are not the Torch/Paddle device types of the same name."""
    if framework == "numpy":
        return "cpu"
    if framework == "jax":
        try:
            devices = x.devices()
        except Exception as exc:  # a tracer: its devices are not known while tracing
            raise TypeError(
                f"got a traced JAX value ({type(x).__name__}, inside jax.jit?): "
                "apply_token_mask is eager; call portable_guided.jax.mask_logits inside jit"
            ) from exc
        # A sharded array spans devices of one backend; any of them names it.
        return f"jax:{next(iter(devices)).platform}"
    if framework == "torch":
        # is_cpu first: building a torch.device costs 2-3x more (right after a forward)
        return "cpu" if x.is_cpu else x.device.type
    place = x.place
    if place.is_cpu_place() or place.is_cuda_pinned_place():
        return "cpu"
    if place.is_gpu_place():
        return "cuda"
    if place.is_xpu_place():
        return "xpu"
    if place.is_custom_place():
        return place.custom_device_type()
    raise TypeError(f"unrecognized Paddle place {place}")


def dtype_name(x: Any, framework: str) -> str:
    """The element type as a short name (``float32``, ``bfloat16``, ``int32``, ...)."""
    if framework in ("numpy", "jax"):
        return str(x.dtype)
    # torch.float32 -> "float32"; paddle.float32 -> "paddle.float32" -> "float32"
    return str(x.dtype).rsplit(".", 1)[-1]
