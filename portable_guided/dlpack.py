"""Zero-copy views between Torch, Paddle and NumPy.

Every conversion here shares memory with its input (same data pointer); nothing is copied.
Paddle documents DLPack for CPU and CUDA places only, so device tensors elsewhere must stay
in their own framework.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from ._frameworks import dtype_name, framework_of

if TYPE_CHECKING:
    import paddle
    import torch

__all__ = ["to_torch", "to_paddle", "host_bits", "host_int32"]

# Same-size unsigned integer type of each float dtype: lets NumPy move float bit patterns
# (bfloat16 included, which NumPy lacks) without converting values.
_BITS_DTYPE = {"float32": np.uint32, "float16": np.uint16, "bfloat16": np.uint16}


def to_torch(x: Any) -> torch.Tensor:
    """A ``torch.Tensor`` sharing memory with ``x`` (Torch, Paddle or NumPy)."""
    import torch

    framework = framework_of(x)
    if framework == "torch":
        return x
    if framework == "numpy":
        return torch.from_numpy(x)
    return torch.from_dlpack(x)


def to_paddle(x: Any) -> paddle.Tensor:
    """A ``paddle.Tensor`` sharing memory with ``x`` (Torch, Paddle or NumPy)."""
    import paddle

    if framework_of(x) == "paddle":
        return x
    return paddle.from_dlpack(x)


def host_array(x: Any, framework: str, dtype: str) -> np.ndarray:
    """A NumPy array over a host float tensor's memory with the same item size: float32 and
    float16 as they are, bfloat16 as int16 (NumPy has none). For kernels that only need the
    item size (the compiled CPU kernel); cheaper than :func:`host_bits` for Torch float32
    and float16, where it is one call into Torch instead of three. Writes change ``x``.
    """
    if framework == "numpy":
        return x
    if framework == "torch":
        if x.requires_grad:  # numpy() refuses those; the masked values are not differentiated
            x = x.detach()
        if dtype == "bfloat16":
            import torch

            x = x.view(torch.int16)
        return x.numpy()
    if dtype == "bfloat16":
        import paddle

        x = paddle.view(x, "int16")
    return np.from_dlpack(x)


def host_bits(x: Any, framework: str | None = None, dtype: str | None = None) -> np.ndarray:
    """A NumPy view of a host float tensor's bit patterns, as unsigned integers.

    Works for float32, float16 and bfloat16 and for any strides; writes through the view
    change ``x``. ``framework`` and ``dtype`` (as ``framework_of`` and ``dtype_name`` name
    them) may be passed when known, which saves looking them up.
    """
    framework = framework or framework_of(x)
    kind = dtype or dtype_name(x, framework)
    bits = _BITS_DTYPE[kind]
    if framework == "numpy":
        return x.view(bits)
    if framework == "torch":
        import torch

        signed = torch.int32 if bits is np.uint32 else torch.int16
        return x.view(signed).numpy().view(bits)
    import paddle

    signed = "int32" if bits is np.uint32 else "int16"
    return np.from_dlpack(paddle.view(x, signed)).view(bits)


def host_int32(x: Any) -> np.ndarray:
    """A NumPy view of a host int32 tensor (Torch, Paddle or NumPy)."""
    framework = framework_of(x)
    if framework == "numpy":
        return x
    if framework == "torch":
        return x.numpy()
    return np.from_dlpack(x)
