"""Token masks for JAX: a pure, jittable :func:`mask_logits` for an engine's own jitted sampler,
and the host-side helpers that keep its shapes static.

``pg.apply_token_mask(jax_array, ...)`` works too (eager, returns a new array: JAX arrays are
immutable). Inside ``jax.jit`` call :func:`mask_logits` instead: it is made of ``jax.numpy``
operations only, so XLA fuses the unpack and the ``where`` into the sampler's graph, with no
host synchronization and shapes that depend only on its inputs' shapes.

Example (a greedy step; the bitmask comes from xgrammar/llguidance on the host)::

    import jax, jax.numpy as jnp, portable_guided.jax as pgj
    from portable_guided import BucketPolicy

    @jax.jit
    def greedy(logits, bitmask, rows):
        return jnp.argmax(pgj.mask_logits(logits, bitmask, rows), axis=-1)

    policy = BucketPolicy(max_batch=256)
    bitmask_dev, rows_dev = pgj.device_bitmask(bitmask, rows, policy=policy,
                                               logits_rows=logits.shape[0])
    tokens = greedy(logits, bitmask_dev, rows_dev)   # one graph per bucket pair

This module imports JAX; ``import portable_guided`` does not import it.
"""

from __future__ import annotations

import operator
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from .buckets import BucketPolicy
from .kernels.static_common import column_allow_words, device_words
from .validation import warn_narrow_bitmask

__all__ = ["mask_logits", "device_bitmask", "NO_ROW"]

NO_ROW = -1
"""The index of a padded bitmask row: it masks no logits row (any index outside
``[0, logits rows)`` does the same)."""


def _static_int(name: str, value: Any) -> int:
    if isinstance(value, bool):
        raise TypeError(f"{name} must be an int, got a bool ({value!r})")
    try:
        return operator.index(value)
    except TypeError:
        raise TypeError(
            f"{name} must be a Python int (static under jit), got {type(value).__name__}"
        ) from None


def mask_logits(
    logits: jax.Array,
    bitmask: jax.Array,
    indices: jax.Array | None = None,
    vocab_size: int | None = None,
) -> jax.Array:
    """Return ``logits`` with every token the bitmask forbids set to ``-inf``. Pure and
    jittable.

    Token ``t`` of a row is allowed when bit ``t % 32`` of ``bitmask[row, t // 32]`` is set
    (xgrammar's layout). Columns at or past ``vocab_size``, and columns the bitmask does not
    cover (a bitmask narrower than the logits), are left as they are.

    Args:
        logits: ``(batch, vocab)`` or ``(vocab,)`` float array (float32, bfloat16, float16).
        bitmask: ``(rows, words)`` (or ``(words,)``) int32 or uint32 words.
        indices: ``None``: bitmask row ``i`` masks logits row ``i`` (then ``rows == batch``).
            Otherwise an integer array of shape ``(rows,)``: bitmask row ``i`` masks logits
            row ``indices[i]``, and an index outside ``[0, batch)`` (:data:`NO_ROW`, for
            padding) masks nothing. Logits rows no index names are left as they are. Valid
            indices must be distinct (checked on the host by :func:`device_bitmask`; under
            ``jit`` a duplicate leaves one of its rows applied). The mapping is explicit, so it
            cannot depend on the order in which requests were sorted. With 64-bit types off
            (JAX's default) a jitted function receives 64-bit indices narrowed to int32
            before this function sees them; :func:`device_bitmask` checks them on the host.
        vocab_size: static int; mask only columns ``[0, vocab_size)``. Default: as many
            columns as both cover (a narrower bitmask warns, at trace time).

    Returns:
        A new array of the logits' shape and dtype. Under ``jit`` with the logits donated,
        XLA writes it into the logits' buffer.

    Raises:
        TypeError, ValueError: shapes, dtypes or ``vocab_size`` that do not fit (they are
            static, so this happens at trace time and names the values).
    """
    for name, value in (("logits", logits), ("bitmask", bitmask), ("indices", indices)):
        if value is not None and not (hasattr(value, "shape") and hasattr(value, "dtype")):
            raise TypeError(f"{name} must be a jax.Array (or NumPy array), got "
                            f"{type(value).__name__} (device_bitmask builds both the bitmask "
                            f"and the indices)")
    if logits.ndim not in (1, 2):
        raise ValueError(f"logits should be 1-D or 2-D, got shape {tuple(logits.shape)}")
    if bitmask.ndim != logits.ndim:
        raise ValueError(f"bitmask should be {logits.ndim}-D like the logits, got shape "
                         f"{tuple(bitmask.shape)} for logits {tuple(logits.shape)}")
    if logits.dtype not in (jnp.float32, jnp.bfloat16, jnp.float16):
        raise TypeError(f"logits dtype must be float32, bfloat16 or float16, got {logits.dtype}")
    if bitmask.dtype not in (jnp.int32, jnp.uint32):
        raise TypeError(f"bitmask must be int32 (or uint32), got {bitmask.dtype}")
    one_d = logits.ndim == 1
    if one_d:
        if indices is not None:
            raise ValueError("indices need 2-D logits and bitmask")
        logits, bitmask = logits[None], bitmask[None]

    batch, width = logits.shape
    rows, words = bitmask.shape
    covered = 32 * words
    if vocab_size is None:
        if covered < width:
            warn_narrow_bitmask(covered, width, stacklevel=2)
        vocab_size = min(width, covered)
    vocab_size = _static_int("vocab_size", vocab_size)
    if not 0 <= vocab_size <= min(width, covered):
        raise ValueError(
            f"vocab_size {vocab_size} must be in [0, {min(width, covered)}]: the logits have "
            f"{width} columns and the bitmask covers {covered} tokens ({words} words)"
        )

    # uint32 words while padding and or-ing (an int32 bitmask is read as its bit patterns).
    mask = bitmask if bitmask.dtype == jnp.uint32 else lax.bitcast_convert_type(bitmask,
                                                                                  jnp.uint32)
    if indices is None:
        if rows != batch:
            raise ValueError(f"without indices the bitmask needs one row per logits row, got "
                             f"{rows} bitmask rows for {batch} logits rows")
    else:
        if indices.shape != (rows,) or not jnp.issubdtype(indices.dtype, jnp.integer):
            raise ValueError(f"indices must be an integer array of shape ({rows},) (one per "
                             f"bitmask row), got {indices.dtype} {tuple(indices.shape)}")
        # Out-of-range (padding) rows go to `batch`, which mode="drop" discards; negative
        # indices would otherwise wrap around to the last rows. Checked in the indices' own
        # dtype: narrowing first would turn 2**32 + 1 into row 1.
        valid = (indices >= 0) & (indices < batch)
        target = jnp.where(valid, indices, batch).astype(jnp.int32)
        full = jnp.full((batch, words), np.uint32(0xFFFFFFFF), jnp.uint32)
        mask = full.at[target].set(mask, mode="drop", unique_indices=False)

    needed = device_words(width)
    if words < needed:
        mask = jnp.pad(mask, ((0, 0), (0, needed - words)), constant_values=np.uint32(0xFFFFFFFF))
    elif words > needed:
        mask = mask[:, :needed]
    allow = column_allow_words(vocab_size, width).view(np.uint32)
    if allow.any():
        mask = mask | jnp.asarray(allow)
    # Bit k of each word moved to the sign bit, then spread over the word by an arithmetic
    # shift: all ones where token k is allowed, zeros where it is blocked. The logits are
    # then blended as integers, (bits & keep) | (-inf & ~keep). On XLA:CPU this runs at the
    # speed of a plain read and write of the logits; in bfloat16 it is 10-20% ahead of every
    # `where` form (a select between 16-bit floats is slow there), in float32 all forms but
    # a bit table are within a few percent, the lead changing with the cache (bench/
    # bench_jax.py, bench/results/jax_cpu_s16*.json). Bit-exact: allowed entries keep their
    # bit patterns (NaN, -0.0 included).
    words32 = lax.bitcast_convert_type(mask, jnp.int32)
    keep = (words32[:, :, None] << (31 - jnp.arange(32, dtype=jnp.int32))) >> 31
    bits_type = jnp.int32 if logits.dtype == jnp.float32 else jnp.int16
    keep = keep.reshape(batch, needed * 32)[:, :width].astype(bits_type)
    bits = lax.bitcast_convert_type(logits, bits_type)
    neg = lax.bitcast_convert_type(jnp.array(-jnp.inf, logits.dtype), bits_type)
    masked = lax.bitcast_convert_type((bits & keep) | (neg & ~keep), logits.dtype)
    return masked[0] if one_d else masked


def device_bitmask(
    bitmask: np.ndarray,
    indices: Any = None,
    *,
    logits_rows: int,
    policy: BucketPolicy | None = None,
    device: Any = None,
) -> tuple[jax.Array, jax.Array]:
    """Pad a host bitmask and its row indices to a bucket and move both in one transfer.

    Args:
        bitmask: ``(rows, words)`` int32 NumPy array from the grammar engine (one row per
            constrained request).
        indices: the logits row of each bitmask row (list or integer array of length
            ``rows``); default ``range(rows)``. Checked here: integers in
            ``[0, logits_rows)``, distinct.
        logits_rows: rows of the logits the result will mask (the engine's padded batch).
        policy: the bucket sizes (default ``BucketPolicy()``); the result has
            ``policy.bucket_for(rows)`` rows, padding rows marked :data:`NO_ROW`.
        device: a ``jax.Device`` or sharding (default: JAX's default device).

    Returns:
        ``(bitmask, indices)`` on the device, ready for :func:`mask_logits`.
    """
    host = np.asarray(bitmask)
    if host.dtype != np.int32 or host.ndim != 2:
        raise TypeError(f"bitmask must be a 2-D int32 array, got {host.dtype} {host.shape}")
    rows, words = host.shape
    logits_rows = _static_int("logits_rows", logits_rows)
    if indices is None:
        rows_of = np.arange(rows, dtype=np.int64)
    else:
        rows_of = np.asarray(indices)
        if rows_of.size == 0:
            rows_of = rows_of.astype(np.int64)  # [] reads as float64
        if rows_of.dtype == object and all(type(i) is int for i in rows_of.ravel()):
            # Python ints past int64: out of range, not "not integers".
            bad_ints = [i for i in rows_of.ravel() if not 0 <= i < logits_rows]
            raise ValueError(f"indices {bad_ints[:8]} out of range [0, {logits_rows})")
        if rows_of.dtype == np.bool_ or not np.issubdtype(rows_of.dtype, np.integer):
            raise TypeError(f"indices must hold integers, got {rows_of.dtype}")
        if rows_of.shape != (rows,):
            raise ValueError(f"indices must have one entry per bitmask row ({rows}), got shape "
                             f"{rows_of.shape}")
    bad = rows_of[(rows_of < 0) | (rows_of >= logits_rows)]
    if bad.size:
        raise ValueError(f"indices {bad[:8].tolist()} out of range [0, {logits_rows})")
    unique, counts = np.unique(rows_of, return_counts=True)
    if unique.size != rows_of.size:
        raise ValueError(f"indices must be unique, got duplicates {unique[counts > 1][:8].tolist()}")
    bucket = (policy or BucketPolicy()).bucket_for(max(rows, 1))
    padded = np.full((bucket, words), -1, np.int32)
    padded[:rows] = host
    padded_rows = np.full(bucket, NO_ROW, np.int32)
    padded_rows[:rows] = rows_of
    placed: tuple[jax.Array, jax.Array] = tuple(jax.device_put((padded, padded_rows), device))
    return placed
