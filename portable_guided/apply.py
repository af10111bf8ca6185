"""The entrypoint: :func:`apply_token_mask`."""

from __future__ import annotations

import sys
from typing import Any, TypeVar

from .kernels import env_may_be_set
from .platform import Platform
from .registry import ENV_VAR, REGISTRY
from .validation import plan_mask

__all__ = ["apply_token_mask"]

T = TypeVar("T")


def apply_token_mask(
    logits: T,
    bitmask: Any,
    *,
    indices: Any = None,
    vocab_size: int | None = None,
    platform: str | Platform | None = None,
) -> T:
    """Set the logits of disallowed tokens to ``-inf``, on whatever device they live.

    The semantics are exactly those of ``xgrammar.apply_token_bitmask_inplace``: token ``t``
    of row ``r`` is allowed when bit ``t % 32`` of ``bitmask[r, t // 32]`` is set.

    Args:
        logits: ``torch.Tensor``, ``paddle.Tensor`` or ``numpy.ndarray``, 1-D or 2-D, float32,
            float16 or bfloat16, any row stride (a column slice of a wider tensor works).
        bitmask: int32 words, 1-D or 2-D, in any of those frameworks, on the CPU or on the
            logits' device.
        indices: rows to mask (a list or an integer tensor); each index selects a row of both
            the logits and the bitmask, so their row counts may differ. Default: every row,
            and then the bitmask needs one row per logits row.
        vocab_size: mask only columns ``[0, vocab_size)``. Default: as many columns as both
            cover; a bitmask narrower than the logits warns.
        platform: force a platform by name (or object) instead of choosing from the device;
            the environment variable ``PORTABLE_GUIDED_PLATFORM`` does the same.

    Returns:
        ``logits`` itself, masked in place. Every built-in platform writes in place; a
        platform whose ``Platform.in_place`` is false returns a new masked tensor instead.

    Raises:
        TypeError, ValueError: bad input (the message names the values); the logits are left
            untouched.
        ImportError: the chosen platform needs a library that is missing (with an install hint).

    Example::

        import torch, portable_guided as pg
        logits = torch.randn(2, 100)
        bitmask = torch.zeros(2, 4, dtype=torch.int32)   # nothing allowed...
        bitmask[:, 0] = 0b1                              # ...but token 0
        pg.apply_token_mask(logits, bitmask)             # logits[:, 1:] is now -inf
    """
    if platform is None and indices is None and vocab_size is None and _plain_call(logits,
                                                                                 bitmask):
        return logits
    resolution = REGISTRY.resolve(logits, platform)
    plan = plan_mask(logits, bitmask, indices=indices, vocab_size=vocab_size, stacklevel=2,
                     framework=resolution.framework, device_type=resolution.device_type)
    if plan.is_noop and resolution.platform.in_place:
        return logits
    # A platform that returns a new array does so even with nothing to mask (its kernel then
    # masks nothing): the caller may donate the result and still hold the input.
    return resolution.kernel(logits, bitmask, plan)


_TORCH_CPU = ("torch", "cpu", None)
_TORCH_CUDA = ("torch", "cuda", None)
# Per registry key: (the kernel the registry chooses, its few-step version for plain calls).
_PLAIN: dict[tuple[str, str, None], tuple[Any, Any]] = {}


def _plain_call(logits: Any, bitmask: Any) -> bool:
    """The common Torch call (CPU or GPU), masked with few Python steps
    (``kernels.compiled.apply_plain_torch``, ``kernels.cuda.apply_plain_cuda``), where the
    registry has already chosen that kernel for such logits and nothing forces another
    platform. Right after a forward each Python step costs microseconds: the general path
    takes tens of us beyond the kernel."""
    torch = sys.modules.get("torch")
    if torch is None or type(logits) is not torch.Tensor:
        return False
    key = _TORCH_CUDA if logits.is_cuda else _TORCH_CPU
    resolution = REGISTRY._cache.get(key)
    if resolution is None:
        return False
    plain = _PLAIN.get(key)
    if plain is None:
        plain = _plain_kernels(key)
        if plain is None:
            return False
    if resolution.kernel is not plain[0] or env_may_be_set(ENV_VAR):
        return False
    return bool(plain[1](logits, bitmask))


def _plain_kernels(key: tuple[str, str, None]) -> tuple[Any, Any] | None:
    """Import the pair for ``key`` once. The CUDA module is taken only once the registry has
    loaded it (it needs Triton)."""
    if key == _TORCH_CPU:
        from .kernels.compiled import apply_plain_torch
        from .kernels.host import apply_host

        _PLAIN[key] = (apply_host, apply_plain_torch)
    else:
        cuda = sys.modules.get("portable_guided.kernels.cuda")
        if cuda is None:
            return None
        _PLAIN[key] = (cuda.apply_cuda_torch, cuda.apply_plain_cuda)
    return _PLAIN[key]
