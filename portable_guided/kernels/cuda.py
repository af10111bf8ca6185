"""The in-place CUDA/ROCm kernel for Torch and Paddle logits.

Torch logits go to our Triton kernel (:mod:`.triton_mask`). Paddle logits become a zero-copy
Torch view through DLPack and are masked in Paddle's memory, on Paddle's current stream. A host
bitmask (and the row indices) go to the device in one non-blocking copy from pinned memory;
nothing in the call waits for the device.

``PORTABLE_GUIDED_CUDA_KERNEL`` picks another kernel: ``triton`` (our default Triton variant),
one of our variants by name (``triton-tiered``, ``triton-word``, ``triton-dense``,
``triton-element``: see :mod:`.triton_mask`), ``xgrammar-triton`` (xgrammar's Triton kernel,
the default until 0.1.0) or ``xgrammar-cuda`` (xgrammar's CUDA kernel, where the rows start
16-byte aligned; xgrammar builds it with ``nvcc`` the first time it is imported, about a
minute, then Torch caches it).
"""

from __future__ import annotations

import functools
import importlib.util
import os
import threading
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from ..dlpack import host_int32, to_torch
from ..validation import MaskPlan
from . import env_may_be_set, plain_torch_pair

if TYPE_CHECKING:
    import torch

__all__ = ["KERNELS", "KERNEL_ENV_VAR", "PARALLEL_COPY_MIN_WORDS", "apply_cuda_torch",
           "apply_cuda_paddle", "apply_plain_cuda", "PinnedStaging", "fill_end_to_end"]

# Torch and the Triton kernels are imported on first use, so importing this module stays light.
# A missing Triton still fails here, when the platform first loads its kernel, so the error
# carries the platform's install hint (Platform.kernel_for).
def _require(*modules: str) -> None:
    for module in modules:
        if importlib.util.find_spec(module) is None:
            raise ImportError(f"No module named {module!r}", name=module)


_require("triton")

KERNEL_ENV_VAR = "PORTABLE_GUIDED_CUDA_KERNEL"
VARIANT_KERNELS = (  # ours, by name
    "triton-word", "triton-dense", "triton-element", "triton-tiered")
OWN_KERNELS = ("triton", *VARIANT_KERNELS)  # "triton": our default variant
KERNELS = (*OWN_KERNELS, "xgrammar-triton", "xgrammar-cuda")


def _kernel_choice() -> str:
    choice = os.environ.get(KERNEL_ENV_VAR) or KERNELS[0]
    if choice not in KERNELS:
        raise ValueError(f"{KERNEL_ENV_VAR} must be one of {KERNELS}, got {choice!r}")
    return choice


# Each kernel is imported once, on its first use.
@functools.cache
def _own_triton_kernel() -> Any:
    from .triton_mask import apply_triton

    return apply_triton


@functools.cache
def _own_plain_launch() -> Any:
    from .triton_mask import apply_plain

    return apply_plain


@functools.cache
def _xgrammar_triton_kernel() -> Any:
    from xgrammar.kernels.apply_token_bitmask_inplace_triton import (
        apply_token_bitmask_inplace_triton,
    )

    return apply_token_bitmask_inplace_triton


@functools.cache
def _xgrammar_cuda_kernel() -> Any:
    """xgrammar's CUDA kernel (built by xgrammar with nvcc on first import, then cached)."""
    from xgrammar.kernels.apply_token_bitmask_inplace_cuda import (
        apply_token_bitmask_inplace_cuda,
    )

    return apply_token_bitmask_inplace_cuda


class PinnedStaging:
    """Two pinned host buffers used in turn for host-to-device copies.

    A buffer is refilled only after the copy issued from it two calls earlier has finished
    (its event), which in a decode loop has always happened long before. Safe to share
    between threads.
    """

    def __init__(self) -> None:
        self._buffers: list[torch.Tensor | None] = [None, None]
        self._events: list[torch.cuda.Event | None] = [None, None]
        self._turn = 0
        self._lock = threading.Lock()

    def to_device(self, parts: Sequence[np.ndarray], device: torch.device) -> torch.Tensor:
        """Copy int32 arrays, laid end to end, to ``device`` without blocking: one copy of
        each into the pinned buffer, one transfer. Returns the 1-D device tensor."""
        with self._lock:
            return self._to_device(parts, device)

    def _to_device(self, parts: Sequence[np.ndarray], device: torch.device) -> torch.Tensor:
        import torch

        size = sum(part.size for part in parts)
        turn, self._turn = self._turn, self._turn ^ 1
        event = self._events[turn]
        if event is not None:
            event.synchronize()
        buffer = self._buffers[turn]
        if buffer is None or buffer.numel() < size:
            buffer = torch.empty(max(size, 1024), dtype=torch.int32, pin_memory=True)
            self._buffers[turn] = buffer
        staged = buffer[:size]
        fill_end_to_end(staged.numpy(), parts, parallel_from=PARALLEL_COPY_MIN_WORDS)
        on_device = staged.to(device, non_blocking=True)
        event = torch.cuda.Event()
        event.record(torch.cuda.current_stream(device))  # the copy's stream, on its device
        self._events[turn] = event
        return on_device


# A bitmask this large (words) is copied into the pinned buffer by Torch's thread pool: a
# B=256, V=151,936 bitmask (4.9 MB) took 0.54-0.70 ms of one thread on an H200's host.
PARALLEL_COPY_MIN_WORDS = 1 << 16


def fill_end_to_end(target: np.ndarray, parts: Sequence[np.ndarray],
                    parallel_from: int | None = None) -> None:
    """Write ``parts`` (any shape and strides) one after another into the 1-D ``target``, in
    C order, one copy each (no intermediate concatenation). Parts of at least
    ``parallel_from`` elements are copied by Torch's thread pool."""
    offset = 0
    for part in parts:
        window = target[offset : offset + part.size].reshape(part.shape)
        if (parallel_from is not None and part.size >= parallel_from and part.flags.writeable
                and part.flags.c_contiguous):
            import torch  # already loaded: the caller stages for a Torch device

            torch.from_numpy(window).copy_(torch.from_numpy(part))
        else:
            window[...] = part
        offset += part.size
    if offset != target.size:
        raise ValueError(f"parts hold {offset} elements for a target of {target.size}")


_staging: dict[int, PinnedStaging] = {}


def _device_inputs(
    bitmask: Any, plan: MaskPlan, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The bitmask (2-D, int32, on ``device``) and the row indices (int32, on ``device``)."""
    rows = None if plan.rows is None else plan.rows.astype(np.int32)
    shape = (plan.bitmask_rows, plan.bitmask_words)
    if not plan.bitmask_on_host:
        mask = to_torch(bitmask).reshape(shape)
        if rows is None:
            return mask, None
        return mask, _staging_for(device).to_device([rows], device)
    words = host_int32(bitmask)
    parts = [words] if rows is None else [words, rows]
    on_device = _staging_for(device).to_device(parts, device)
    mask = on_device[: words.size].view(shape)
    return mask, None if rows is None else on_device[words.size :]


def _staging_for(device: torch.device) -> PinnedStaging:
    import torch

    index = device.index if device.index is not None else torch.cuda.current_device()
    return _staging.setdefault(index, PinnedStaging())


def apply_cuda_torch(logits: torch.Tensor, bitmask: Any, plan: MaskPlan) -> torch.Tensor:
    """Mask CUDA Torch logits in place on the current stream; returns ``logits``."""
    table = logits.view(plan.batch, plan.width)
    if table.stride(1) != 1:
        # The Triton kernel addresses columns contiguously; the static graph takes any strides.
        from .static_torch import apply_static_torch

        return apply_static_torch(logits, bitmask, plan)
    mask, rows = _device_inputs(bitmask, plan, logits.device)
    if mask.stride() != (mask.shape[1], 1):
        mask = mask.contiguous()  # the kernel reads the row stride as the row length
    choice = _kernel_choice()
    if choice not in OWN_KERNELS and table.shape[0] * table.stride(0) >= 2**31:
        choice = "triton"  # xgrammar's kernels address rows with 32-bit offsets
    if choice == "xgrammar-cuda" and _fits_xgrammar_cuda(table, plan.vocab_size):
        # It masks min(width, 32 * words) columns and wants no more words than the width
        # needs: narrowing both views gives exactly vocab_size.
        words = -(-plan.vocab_size // 32)
        _xgrammar_cuda_kernel()(table[:, : plan.vocab_size], mask[:, :words], rows)
    elif choice == "xgrammar-triton":
        _xgrammar_triton_kernel()(table, mask, plan.vocab_size, rows)
    else:
        # A variant by name, else our default (also for xgrammar-cuda where it cannot run).
        named = {"variant": choice} if choice in VARIANT_KERNELS else {}
        _own_triton_kernel()(table, mask, plan.vocab_size, rows, **named)
    return logits


def apply_plain_cuda(logits: Any, bitmask: Any) -> bool:
    """Mask the most common GPU call with few Python steps: 2-D Torch CUDA logits with unit
    column stride (float32, bfloat16 or float16, no autograd) and a 2-D contiguous int32
    bitmask on the same device, one row per logits row and covering every column; no
    indices, no ``vocab_size``, our default kernel. Such a call cannot fail validation, so
    the checks of :func:`~portable_guided.validation.plan_mask` reduce to these. Returns
    False, having done nothing, for any other call (the general path then checks and masks
    it); the caller has checked that the registry would choose this kernel."""
    torch = plain_torch_pair(logits, bitmask)
    if torch is None:
        return False
    if not _PLAIN_DTYPES:
        _PLAIN_DTYPES.update((torch.float32, torch.float16, torch.bfloat16))
    if (logits.dtype not in _PLAIN_DTYPES or bitmask.dtype != torch.int32
            or logits.dim() != 2 or bitmask.dim() != 2):
        return False
    device = logits.get_device()  # -1 on the CPU
    batch, width = logits.shape
    rows, words = bitmask.shape
    row_stride, column_stride = logits.stride()
    if (device < 0 or bitmask.get_device() != device or rows != batch
            or 32 * words < width or width == 0 or column_stride != 1
            or bitmask.stride() != (words, 1) or logits.requires_grad
            or env_may_be_set(KERNEL_ENV_VAR)
            or device != torch._C._cuda_getDevice()):  # Triton launches on the current one
        return False
    _own_plain_launch()(logits, bitmask, batch, width, words, row_stride, device)
    return True


_PLAIN_DTYPES: set[Any] = set()  # float32, float16, bfloat16: filled on first use


def _fits_xgrammar_cuda(table: torch.Tensor, vocab_size: int) -> bool:
    """Whether xgrammar's CUDA kernel masks exactly ``vocab_size`` columns of ``table``: it
    reads 16-byte groups when the row stride allows, and then also writes the columns of the
    last group past ``vocab_size``; its first row must start 16-byte aligned."""
    group = 16 // table.element_size()
    return table.data_ptr() % 16 == 0 and (
        vocab_size % group == 0 or table.stride(0) % group != 0)


def apply_cuda_paddle(logits: Any, bitmask: Any, plan: MaskPlan) -> Any:
    """Mask Paddle GPU logits in place, in Paddle's memory and on Paddle's current stream;
    returns ``logits``."""
    import paddle
    import torch

    view = to_torch(logits)  # zero-copy
    stream = paddle.device.current_stream(logits.place).stream_base.cuda_stream
    with torch.cuda.stream(torch.cuda.ExternalStream(stream, device=view.device)):
        apply_cuda_torch(view, bitmask, plan)
    return logits
