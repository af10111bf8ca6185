"""The kernel for JAX logits: ``apply_token_mask`` on a ``jax.Array`` returns a new array.

A host bitmask is expanded on the host to one row per logits row (``static_common``: unmasked
rows and columns past ``vocab_size`` all-allowed), moved to the logits' device in one
transfer, and applied by one ahead-of-time compiled executable per logits shape and dtype
(:func:`executable`, also what ``precompile --platform jax`` fills), so a decode loop whose
logits keep their bucket shape compiles nothing. The executable runs
:func:`portable_guided.jax.mask_logits`; the logits never leave the device. A bitmask already
on the device goes through ``mask_logits`` with its row indices, also on the device.

JAX arrays are immutable, so the input is never modified (``Platform.in_place`` is false) and
never donated: ``apply_token_mask`` cannot know whether the caller still holds the logits.
Inside an engine's own ``jit``, call ``mask_logits`` and donate there.
"""

from __future__ import annotations

import functools
import threading
from typing import TYPE_CHECKING, Any

import numpy as np

from ..dlpack import host_int32
from ..validation import MaskPlan
from .static_common import column_allow_words, device_words, expand_bitmask

if TYPE_CHECKING:
    import jax

__all__ = ["apply_static_jax", "executable", "warmup"]

_EXECUTABLES: dict[tuple[Any, ...], Any] = {}
_LOCK = threading.Lock()


def _single_device(logits: jax.Array) -> Any:
    devices = logits.devices()
    if len(devices) != 1:
        raise ValueError(
            f"apply_token_mask serves JAX logits on one device; these span {len(devices)} "
            f"({logits.sharding}); call portable_guided.jax.mask_logits inside your jit instead"
        )
    return next(iter(devices))


def _apply_full(logits: jax.Array, mask: jax.Array) -> jax.Array:
    from ..jax import mask_logits

    width = logits.shape[-1]
    table = logits.reshape(-1, width)
    return mask_logits(table, mask, vocab_size=width).reshape(logits.shape)


def executable(shape: tuple[int, ...], dtype: Any, device: Any, *, donate: bool = False) -> Any:
    """The compiled apply for logits of ``shape`` and ``dtype`` on ``device`` (a
    ``jax.Device``), taking ``(logits, mask)`` with ``mask`` the expanded int32 bitmask of shape
    ``(rows, device_words(width))``. Compiled ahead of time (``lower().compile()``) on first
    use and kept for the process."""
    import jax
    import jax.numpy as jnp

    dtype = jnp.dtype(dtype)
    key = (tuple(shape), dtype.name, device, donate)
    compiled = _EXECUTABLES.get(key)
    if compiled is None:
        with _LOCK:
            compiled = _EXECUTABLES.get(key)
            if compiled is None:
                sharding = jax.sharding.SingleDeviceSharding(device)
                rows = 1 if len(shape) == 1 else shape[0]
                logits = jax.ShapeDtypeStruct(tuple(shape), dtype, sharding=sharding)
                mask = jax.ShapeDtypeStruct((rows, device_words(shape[-1])), jnp.int32,
                                            sharding=sharding)
                jitted = jax.jit(_apply_full, donate_argnums=(0,) if donate else ())
                compiled = jitted.lower(logits, mask).compile()
                _EXECUTABLES[key] = compiled
    return compiled


def _apply_device_bitmask(logits: jax.Array, bitmask: jax.Array, rows: jax.Array,
                          allow: jax.Array) -> jax.Array:
    """``mask_logits`` for a bitmask already on the device; ``allow`` (one int32 word per
    bitmask word, :func:`column_allow_words`) sets the bits of the tokens at or past
    ``vocab_size``, so ``vocab_size`` is data and one graph per shape serves all."""
    from ..jax import mask_logits

    width = logits.shape[-1]
    words = bitmask.shape[-1]
    masked = mask_logits(logits.reshape(-1, width), bitmask.reshape(-1, words) | allow, rows,
                         vocab_size=min(width, 32 * words))
    return masked.reshape(logits.shape)


@functools.cache
def _device_apply() -> Any:
    import jax

    return jax.jit(_apply_device_bitmask)


def apply_static_jax(logits: jax.Array, bitmask: Any, plan: MaskPlan) -> jax.Array:
    """Masked copy of ``logits`` (a ``jax.Array`` on one device); ``logits`` is unchanged."""
    import jax

    device = _single_device(logits)
    if plan.bitmask_on_host:
        mask = expand_bitmask(host_int32(bitmask), plan)
        compiled = executable(tuple(logits.shape), logits.dtype, device)
        return compiled(logits, jax.device_put(mask, device))
    # A JAX bitmask on the device: row r of the bitmask masks logits row r, for the selected
    # rows; every other bitmask row maps to no row.
    if bitmask.devices() != {device}:
        raise ValueError(f"the bitmask is on {sorted(str(d) for d in bitmask.devices())} and the "
                         f"logits on {device}: put both on one device (or pass a NumPy bitmask)")
    rows = np.full(plan.bitmask_rows, -1, np.int32)
    selected = plan.masked_rows
    rows[selected] = selected
    allow = column_allow_words(plan.vocab_size, 32 * plan.bitmask_words)
    masked: jax.Array = _device_apply()(logits, bitmask, *jax.device_put((rows, allow), device))
    return masked


def warmup(rows: int, width: int, dtype: Any, device: Any) -> None:
    """Compile (ahead of time) the apply executable for logits of shape ``(rows, width)``."""
    executable((rows, width), dtype, device)
