"""Input checks shared by every implementation of ``apply_token_mask``.

Everything is checked before any implementation runs, so bad input never leaves logits half
written, and every implementation receives the same normalized :class:`MaskPlan`.
"""

from __future__ import annotations

import operator
import warnings
from dataclasses import dataclass
from typing import Any

import numpy as np

from ._frameworks import device_type_of, dtype_name, framework_of

__all__ = ["LOGIT_DTYPES", "MaskPlan", "int_list", "plan_mask", "warn_narrow_bitmask"]

LOGIT_DTYPES = ("float32", "float16", "bfloat16")


@dataclass(frozen=True)
class MaskPlan:
    """A validated, framework-neutral description of one ``apply_token_mask`` call.

    Attributes:
        batch: rows of the logits (1 for 1-D logits).
        width: columns of the logits.
        bitmask_rows: rows of the bitmask (1 for a 1-D bitmask).
        bitmask_words: int32 words per bitmask row.
        vocab_size: columns ``[0, vocab_size)`` are masked; later columns are left as they are.
        rows: row indices to mask (each one a row of both logits and bitmask), or ``None``
            for every row (then ``bitmask_rows == batch``).
        dtype: the logits' element type name.
        framework: ``torch``, ``paddle``, ``jax`` or ``numpy`` (of the logits).
        device_type: device family of the logits.
        bitmask_framework: framework of the bitmask.
        bitmask_on_host: whether the bitmask is in host memory.
    """

    batch: int
    width: int
    bitmask_rows: int
    bitmask_words: int
    vocab_size: int
    rows: np.ndarray | None
    dtype: str
    framework: str
    device_type: str
    bitmask_framework: str
    bitmask_on_host: bool

    @property
    def is_noop(self) -> bool:
        """True when the call has nothing to mask (no rows, no rows selected or no columns)."""
        return self.vocab_size == 0 or self.batch == 0 or (
            self.rows is not None and self.rows.size == 0)

    @property
    def masked_rows(self) -> np.ndarray:
        """Row indices to mask, as an int64 array."""
        return np.arange(self.batch) if self.rows is None else self.rows


def int_list(values: Any, what: str) -> list[int]:
    """``values`` (a sequence of ints) as a list of Python ints, or ``TypeError`` naming the
    offender. Booleans are refused: ``bool`` is an ``int`` subclass, so ``[True, False]``
    would silently mean rows 1 and 0."""
    if isinstance(values, (str, bytes)):
        raise TypeError(f"{what} must be a sequence of ints, got {type(values).__name__}")
    out = []
    for v in values:
        if isinstance(v, (bool, np.bool_)):
            raise TypeError(f"{what} must hold integers, got a bool ({v!r})")
        try:
            out.append(operator.index(v))
        except TypeError:
            raise TypeError(
                f"{what} must hold integers, got {type(v).__name__} ({v!r:.40})") from None
    return out


def _as_index_array(indices: Any, limit: int) -> np.ndarray:
    """``indices`` as an int64 array; Python lists are range-checked here (an int too large
    for int64 must be a ValueError, not NumPy's OverflowError)."""
    if isinstance(indices, (list, tuple, range)):
        values = int_list(indices, "indices")
        bad = [v for v in values if not 0 <= v < limit]
        if bad:
            raise ValueError(f"indices {bad[:8]} out of range [0, {limit})")
        return np.array(values, dtype=np.int64)
    try:
        framework = framework_of(indices)
    except TypeError:
        raise TypeError(
            f"indices must be a list of ints or an integer tensor, got {type(indices).__name__}"
        ) from None
    kind = dtype_name(indices, framework)
    if not kind.startswith(("int", "uint")):
        raise TypeError(f"indices must have an integer dtype, got {kind}")
    if len(indices.shape) != 1:
        raise ValueError(f"indices must be 1-D, got shape {tuple(indices.shape)}")
    # A device tensor costs one device-to-host copy here; pass a list to avoid it.
    host = indices if framework == "numpy" else np.asarray(indices.tolist())
    if kind == "uint64" and host.size and int(host.max()) >= limit:  # past int64, possibly
        raise ValueError(f"indices {host[host >= limit][:8].tolist()} out of range "
                         f"[0, {limit})")
    return host.astype(np.int64)


def _element_strides(x: Any, framework: str) -> tuple[int, ...] | None:
    """Strides of ``x`` in elements, or None where the framework does not expose them."""
    if framework == "torch":
        if x.is_contiguous():  # the common case; XLA tensors have no strides to read
            return None
        try:
            return tuple(x.stride())
        except (RuntimeError, NotImplementedError):  # a device without strided storage
            return None
    if framework == "numpy":
        return tuple(s // x.itemsize for s in x.strides)
    if framework == "jax":
        return None  # immutable, no views: elements never alias
    strides = getattr(x, "strides", None)  # Paddle 3 (strided views), in elements
    return tuple(strides) if strides is not None else None


def _has_internal_overlap(shape: tuple[int, ...], strides: tuple[int, ...]) -> bool:
    """True when two different indices of a view with ``shape`` and element ``strides`` may
    address the same element (``expand``, ``as_strided``): masking one row would write
    another. Dimensions are taken from the smallest stride up; each must step over
    everything the smaller ones span (a sufficient test, as Torch's own). An empty view
    has no elements to share (NumPy gives it zero strides)."""
    if 0 in shape:
        return False
    span = 1
    for stride, size in sorted((abs(s), n) for n, s in zip(shape, strides) if n > 1):
        if stride < span:
            return True
        span += stride * (size - 1)
    return False


def warn_narrow_bitmask(covered: int, width: int, stacklevel: int) -> None:
    """The warning for a bitmask covering fewer tokens than the logits have columns: word
    for word xgrammar's (0.2.8), so a user's warning filter written for xgrammar matches
    ours too."""
    warnings.warn(
        f"The bitmask covers only {covered} tokens but logits have {width}, so "
        f"logits[..., {covered}:] are left unmasked. Allocate the bitmask with the full "
        "vocab size, or pass vocab_size explicitly.",
        stacklevel=stacklevel + 1,
    )


def plan_mask(
    logits: Any,
    bitmask: Any,
    *,
    indices: Any = None,
    vocab_size: int | None = None,
    stacklevel: int = 2,
    framework: str | None = None,
    device_type: str | None = None,
) -> MaskPlan:
    """Check the arguments of ``apply_token_mask`` and describe the work.

    ``framework`` and ``device_type`` of the logits may be passed when already known (the
    registry's resolution has them), which saves looking them up again.

    Raises ``TypeError`` or ``ValueError`` naming the offending values.
    """
    framework = framework or framework_of(logits)
    dtype = dtype_name(logits, framework)
    shape = tuple(logits.shape)
    if len(shape) not in (1, 2):
        raise ValueError(f"logits should be 1-D or 2-D, got {len(shape)}-D with shape {shape}")
    if dtype not in LOGIT_DTYPES:
        raise TypeError(f"logits dtype must be one of {', '.join(LOGIT_DTYPES)}, got {dtype}")
    strides = _element_strides(logits, framework)
    if strides is not None and _has_internal_overlap(shape, strides):
        raise ValueError(
            f"logits elements share memory (shape {shape}, strides {strides}, e.g. from "
            "expand): masking one row would write another; pass a tensor whose elements do "
            "not alias (.contiguous())"
        )

    try:
        bitmask_framework = framework_of(bitmask)
    except TypeError:
        raise TypeError(
            f"bitmask must be a torch.Tensor, paddle.Tensor, jax.Array or numpy.ndarray, "
            f"got {type(bitmask).__name__}"
        ) from None
    bitmask_dtype = dtype_name(bitmask, bitmask_framework)
    bitmask_shape = tuple(bitmask.shape)
    if bitmask_dtype != "int32":
        raise TypeError(f"bitmask must be int32, got {bitmask_dtype}")
    if len(bitmask_shape) not in (1, 2):
        raise ValueError(
            f"bitmask should be 1-D or 2-D, got {len(bitmask_shape)}-D with shape {bitmask_shape}"
        )

    device_type = device_type or device_type_of(logits, framework)
    bitmask_device = device_type_of(bitmask, bitmask_framework)
    if bitmask_device not in ("cpu", device_type):
        if bitmask_framework == "jax":  # its device type names JAX's backend ("jax:cpu")
            raise ValueError(
                f"a JAX bitmask must be on the logits' device ({device_type}), got one on "
                f"{bitmask_device}; pass a NumPy array for a bitmask in host memory"
            )
        raise ValueError(
            f"bitmask must be on the CPU or on the logits' device ({device_type}), "
            f"got {bitmask_device}"
        )
    if bitmask_device != "cpu" and bitmask_framework != framework:
        raise ValueError(
            f"a device bitmask must come from the logits' framework ({framework}), "
            f"got a {bitmask_framework} tensor on {bitmask_device}"
        )

    batch, width = (1, shape[0]) if len(shape) == 1 else shape
    bitmask_rows, words = (1, bitmask_shape[0]) if len(bitmask_shape) == 1 else bitmask_shape

    covered = 32 * words
    if vocab_size is None:
        if covered < width:
            warn_narrow_bitmask(covered, width, stacklevel + 1)
        vocab_size = min(width, covered)
    else:
        if isinstance(vocab_size, bool) or not isinstance(vocab_size, (int, np.integer)):
            raise TypeError(f"vocab_size must be an int, got {type(vocab_size).__name__}")
        vocab_size = int(vocab_size)
        if not 0 <= vocab_size <= min(width, covered):
            raise ValueError(
                f"vocab_size {vocab_size} must be in [0, {min(width, covered)}]: the logits "
                f"have {width} columns and the bitmask covers {covered} tokens ({words} words)"
            )

    rows: np.ndarray | None = None
    if indices is None:
        if bitmask_rows != batch:
            raise ValueError(
                f"without indices the bitmask needs one row per logits row, got {bitmask_rows} "
                f"bitmask rows for {batch} logits rows"
            )
    else:
        limit = min(batch, bitmask_rows)
        rows = _as_index_array(indices, limit)
        bad = rows[(rows < 0) | (rows >= limit)]
        if bad.size:
            raise ValueError(
                f"indices {bad[:8].tolist()} out of range [0, {limit}) (logits have {batch} rows, "
                f"bitmask has {bitmask_rows})"
            )
        unique, counts = np.unique(rows, return_counts=True)
        if unique.size != rows.size:
            duplicates = unique[counts > 1][:8].tolist()
            raise ValueError(f"indices must be unique, got duplicates {duplicates}")

    return MaskPlan(
        batch=batch,
        width=width,
        bitmask_rows=bitmask_rows,
        bitmask_words=words,
        vocab_size=vocab_size,
        rows=rows,
        dtype=dtype,
        framework=framework,
        device_type=device_type,
        bitmask_framework=bitmask_framework,
        bitmask_on_host=bitmask_device == "cpu",
    )
