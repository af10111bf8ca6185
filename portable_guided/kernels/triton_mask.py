"""Our Triton kernels for in-place masking of GPU logits, and a low-overhead launcher.

The semantics are xgrammar's: column ``c`` of row ``r`` is masked when bit ``c % 32`` of
``bitmask[r, c // 32]`` is clear. Each kernel runs one program per (row, ``BLOCKS`` blocks of
``BLOCK_SIZE`` columns):

- ``triton-word`` (the default): a block is read as ``(words, 32)``, so each bitmask word is
  loaded once and its bits broadcast over its 32 columns. Load and store masks are per word:
  a word that allows everything is neither read nor written, one that blocks everything is
  written without being read, and only mixed words are read and written. A mask constant over
  each word keeps the loads and stores vectorized (16 bytes a thread).
- ``triton-dense``: the same layout with the choice made per block: skip the block, write it
  without reading it, or read and write all of it.
- ``triton-element``: one thread per column, ``-inf`` written through a per-element store
  mask, which defeats vectorization (the default of the first GPU run).

On an H200 (``bench/results/cuda_h200_s25/``, device time, JSON-like masks, B >= 64):
``triton-word`` reaches 79-151% (fp32) and 98-132% (bf16) of a device-to-device copy's rate,
``triton-element`` 52-82% and 20-28%. Launch shapes from 1,024 to 8,192 columns, 4 to 16 warps
and 1 to 4 blocks per program measured within noise of the default (2,048, 8, 1).

Triton's own launch spends about 25 us of host time per call binding and specializing the
arguments. :func:`apply_triton` launches the compiled kernel directly once Triton has compiled
it for the same specialization (the pointers' dtypes and 16-byte alignment, the integers'
divisibility by 16, equality to 1 and width) and the same constants.

Imported on first use only (it imports Triton).
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any, NamedTuple

import triton
import triton.language as tl

if TYPE_CHECKING:
    import torch

__all__ = ["VARIANTS", "DEFAULT_VARIANT", "FAST_LAUNCH_ENV_VAR", "BLOCK", "apply_triton",
           "apply_plain"]

BLOCK = 2048  # columns per program (every variant's default)


@triton.jit  # a Triton kernel: its parameters carry no Python types
def _element_kernel(  # type: ignore[no-untyped-def]
    logits_ptr,
    bitmask_ptr,
    rows_ptr,
    vocab_size,
    logits_row_stride,
    bitmask_row_stride,
    HAS_ROWS: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    BLOCKS: tl.constexpr,
):
    program_row = tl.program_id(0)
    row = tl.load(rows_ptr + program_row) if HAS_ROWS else program_row
    row = row.to(tl.int64)  # B * V can pass 2**31 elements
    for step in tl.static_range(BLOCKS):
        block = tl.program_id(1) * BLOCKS + step
        columns = block * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
        in_vocab = columns < vocab_size
        # 32 neighbouring threads read the same word: one transaction, served from L1.
        words = tl.load(bitmask_ptr + row * bitmask_row_stride + columns // 32, mask=in_vocab,
                        other=-1)
        blocked = ((words >> (columns % 32)) & 1) == 0
        tl.store(logits_ptr + row * logits_row_stride + columns, float("-inf"),
                 mask=in_vocab & blocked)


@triton.jit
def _word_kernel(  # type: ignore[no-untyped-def]
    logits_ptr,
    bitmask_ptr,
    rows_ptr,
    vocab_size,
    logits_row_stride,
    bitmask_row_stride,
    HAS_ROWS: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    BLOCKS: tl.constexpr,
):
    program_row = tl.program_id(0)
    row = tl.load(rows_ptr + program_row) if HAS_ROWS else program_row
    row = row.to(tl.int64)
    lanes = tl.arange(0, 32)
    for step in tl.static_range(BLOCKS):
        block = tl.program_id(1) * BLOCKS + step
        word_index = block * (BLOCK_SIZE // 32) + tl.arange(0, BLOCK_SIZE // 32)
        words = tl.load(bitmask_ptr + row * bitmask_row_stride + word_index,
                        mask=word_index * 32 < vocab_size, other=-1)
        columns = word_index[:, None] * 32 + lanes[None, :]
        in_vocab = columns < vocab_size
        pointers = logits_ptr + row * logits_row_stride + columns
        # Constant over each word's 32 columns, so loads and stores stay vectorized.
        write = (words != -1)[:, None] & in_vocab
        read = (words != 0)[:, None] & write
        x = tl.load(pointers, mask=read)  # what it skips is never kept: blocked or unwritten
        allowed = ((words[:, None] >> lanes[None, :]) & 1) != 0
        # Selected in float32 (exact both ways): Triton's interpreter has no bf16 constants.
        masked = tl.where(allowed, x.to(tl.float32), float("-inf"))
        tl.store(pointers, masked.to(x.dtype), mask=write)


@triton.jit
def _dense_kernel(  # type: ignore[no-untyped-def]
    logits_ptr,
    bitmask_ptr,
    rows_ptr,
    vocab_size,
    logits_row_stride,
    bitmask_row_stride,
    HAS_ROWS: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    BLOCKS: tl.constexpr,
):
    program_row = tl.program_id(0)
    row = tl.load(rows_ptr + program_row) if HAS_ROWS else program_row
    row = row.to(tl.int64)
    lanes = tl.arange(0, 32)
    for step in tl.static_range(BLOCKS):
        block = tl.program_id(1) * BLOCKS + step
        word_index = block * (BLOCK_SIZE // 32) + tl.arange(0, BLOCK_SIZE // 32)
        words = tl.load(bitmask_ptr + row * bitmask_row_stride + word_index,
                        mask=word_index * 32 < vocab_size, other=-1)
        some_blocked = tl.sum((words != -1).to(tl.int32), axis=0) > 0
        some_allowed = tl.sum((words != 0).to(tl.int32), axis=0) > 0
        if some_blocked:
            columns = word_index[:, None] * 32 + lanes[None, :]
            in_vocab = columns < vocab_size
            pointers = logits_ptr + row * logits_row_stride + columns
            if some_allowed:
                x = tl.load(pointers, mask=in_vocab)
                allowed = ((words[:, None] >> lanes[None, :]) & 1) != 0
                masked = tl.where(allowed, x.to(tl.float32), float("-inf"))
                tl.store(pointers, masked.to(x.dtype), mask=in_vocab)
            else:
                tl.store(pointers, float("-inf"), mask=in_vocab)


@triton.jit
def _either_or(a, b):  # type: ignore[no-untyped-def]
    return a | b


@triton.jit
def _tiered_kernel(  # type: ignore[no-untyped-def]
    logits_ptr,
    bitmask_ptr,
    rows_ptr,
    vocab_size,
    logits_row_stride,
    bitmask_row_stride,
    HAS_ROWS: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    BLOCKS: tl.constexpr,
):
    program_row = tl.program_id(0)
    row = tl.load(rows_ptr + program_row) if HAS_ROWS else program_row
    row = row.to(tl.int64)
    lanes = tl.arange(0, 32)
    for step in tl.static_range(BLOCKS):
        block = tl.program_id(1) * BLOCKS + step
        word_index = block * (BLOCK_SIZE // 32) + tl.arange(0, BLOCK_SIZE // 32)
        words = tl.load(bitmask_ptr + row * bitmask_row_stride + word_index,
                        mask=word_index * 32 < vocab_size, other=-1)
        # One reduction says which tier the block is in: bit 0, some word blocks a column;
        # bit 1, some word allows one.
        tiers = tl.reduce((words != -1).to(tl.int32) | ((words != 0).to(tl.int32) << 1), 0,
                          _either_or)
        if (tiers & 1) != 0:  # an all-allowed block does no per-column work at all
            columns = word_index[:, None] * 32 + lanes[None, :]
            in_vocab = columns < vocab_size
            pointers = logits_ptr + row * logits_row_stride + columns
            if (tiers & 2) == 0:  # all blocked: written, never read
                tl.store(pointers, float("-inf"), mask=in_vocab)
            else:  # the word kernel's per-word masks
                write = (words != -1)[:, None] & in_vocab
                read = (words != 0)[:, None] & write
                x = tl.load(pointers, mask=read)
                allowed = ((words[:, None] >> lanes[None, :]) & 1) != 0
                masked = tl.where(allowed, x.to(tl.float32), float("-inf"))
                tl.store(pointers, masked.to(x.dtype), mask=write)


class Variant(NamedTuple):
    """A kernel and its launch shape: columns per block, warps, blocks per program."""

    kernel: Any
    block: int
    num_warps: int
    blocks: int


VARIANTS = {
    "triton-word": Variant(_word_kernel, BLOCK, 8, 1),
    "triton-dense": Variant(_dense_kernel, BLOCK, 8, 1),
    "triton-element": Variant(_element_kernel, BLOCK, 8, 1),
    "triton-tiered": Variant(_tiered_kernel, BLOCK, 8, 1),
}
DEFAULT_VARIANT = "triton-word"
FAST_LAUNCH_ENV_VAR = "PORTABLE_GUIDED_TRITON_FAST_LAUNCH"


def apply_triton(
    table: torch.Tensor, bitmask: torch.Tensor, vocab_size: int, rows: torch.Tensor | None,
    variant: str = DEFAULT_VARIANT, block: int | None = None, num_warps: int | None = None,
    blocks: int | None = None, device: int | None = None,
) -> None:
    """Mask ``table`` (2-D, unit column stride) in place from ``bitmask`` (2-D int32, unit
    column stride, on the same device), for columns below ``vocab_size`` and the rows in
    ``rows`` (1-D int32 on the device; each names a row of both) or every row, on the current
    stream of the current device (``device``: its index, when the caller has it).
    ``variant`` names a kernel of :data:`VARIANTS`; ``block``, ``num_warps`` and ``blocks``
    override its launch shape (benchmarks)."""
    count = table.shape[0] if rows is None else rows.shape[0]
    if count == 0 or vocab_size == 0:
        return
    shape = VARIANTS[variant]
    block = block or shape.block
    blocks = blocks or shape.blocks
    grid = (count, -(-vocab_size // (block * blocks)))
    args = (table, bitmask, rows if rows is not None else bitmask, vocab_size,
            table.stride(0), bitmask.stride(0))
    constants = (rows is not None, block, blocks)
    _launch(shape.kernel, grid, args, constants, num_warps or shape.num_warps, device)


# (kernel, num_warps, constants, device, specialization) -> Triton's compiled kernel
_compiled: dict[tuple[Any, ...], Any] = {}


def _specialization(arg: Any) -> Any:
    """What Triton specializes a kernel on, for our argument types: a tensor's dtype and
    16-byte alignment; an integer's divisibility by 16, equality to 1 and width."""
    if isinstance(arg, int):
        return (arg == 1, arg % 16 == 0, -2**31 <= arg < 2**31)
    return (arg.dtype, arg.data_ptr() % 16 == 0)


def _launch(kernel: Any, grid: tuple[int, int], args: tuple[Any, ...],
            constants: tuple[bool, int, int], num_warps: int, device: int | None) -> None:
    """Launch through the compiled kernel when one exists for this specialization and these
    constants (a few us of host time), else through Triton (which compiles it), keeping what
    Triton returns."""
    import torch

    has_rows, block, blocks = constants
    if not args[0].is_cuda:  # Triton's interpreter, on CPU tensors
        kernel[grid](*args, HAS_ROWS=has_rows, BLOCK_SIZE=block, BLOCKS=blocks,
                     num_warps=num_warps)
        return
    if device is None:
        device = torch.cuda.current_device()
    key = (kernel, num_warps, constants, device, *map(_specialization, args))
    compiled = _compiled.get(key)
    if compiled is None or not _fast_launch_allowed():
        compiled = kernel[grid](*args, HAS_ROWS=has_rows, BLOCK_SIZE=block, BLOCKS=blocks,
                                num_warps=num_warps)
        if hasattr(compiled, "result"):  # compiled asynchronously
            compiled = compiled.result()
        if len(_compiled) < 256:  # engines use a handful of keys
            _compiled[key] = compiled
        return
    stream = torch._C._cuda_getCurrentRawStream(device)
    compiled.run(grid[0], grid[1], 1, stream, compiled.function, compiled.packed_metadata,
                 None, None, None, *args, *constants)


# The plain call's launches, by (dtype, device, the specialization of its pointers and
# integers): Triton's launcher, the kernel's handle and its packed metadata.
_plain_launches: dict[tuple[Any, ...], tuple[Any, Any, Any]] = {}


def apply_plain(table: torch.Tensor, bitmask: torch.Tensor, batch: int, width: int, words: int,
                device: int) -> None:
    """:func:`apply_triton` with the default variant over every row of ``table``
    (``batch`` x ``width``, unit column stride) from ``bitmask`` (``batch`` x ``words``,
    contiguous, ``32 * words >= width``), both on the current device ``device``: the caller
    has checked all of that. Once the kernel is compiled for this specialization, the launch
    takes the pointers as integers (Triton's launcher then neither calls ``data_ptr`` nor asks
    the driver about them) and skips the general key."""
    table_ptr, mask_ptr, stride = table.data_ptr(), bitmask.data_ptr(), table.stride(0)
    key = (table.dtype, device, table_ptr % 16 == 0, mask_ptr % 16 == 0, _int_key(width),
           _int_key(stride), _int_key(words))
    launch = _plain_launches.get(key)
    if launch is None or not _fast_launch_allowed():
        apply_triton(table, bitmask, width, None, device=device)
        _remember_plain(key, table, bitmask, width, device)
        return
    import torch

    run, function, metadata = launch
    run(batch, -(-width // _PLAIN_COLUMNS), 1, torch._C._cuda_getCurrentRawStream(device), function,
        metadata, None, None, None, table_ptr, mask_ptr, mask_ptr, width, stride, words,
        *_PLAIN_CONSTANTS)


_PLAIN_SHAPE = VARIANTS[DEFAULT_VARIANT]
_PLAIN_CONSTANTS = (False, _PLAIN_SHAPE.block, _PLAIN_SHAPE.blocks)  # HAS_ROWS, BLOCK_SIZE, BLOCKS
_PLAIN_COLUMNS = _PLAIN_SHAPE.block * _PLAIN_SHAPE.blocks  # per program


def _int_key(value: int) -> int:
    """Triton's specialization of an integer argument, as one small integer."""
    return (value == 1) | (value % 16 == 0) << 1 | (-2**31 <= value < 2**31) << 2


def _remember_plain(key: tuple[Any, ...], table: torch.Tensor, bitmask: torch.Tensor,
                    width: int, device: int) -> None:
    """Keep the plain call's launch for ``key`` once :func:`apply_triton` has compiled it."""
    args = (table, bitmask, bitmask, width, table.stride(0), bitmask.stride(0))
    general = (_PLAIN_SHAPE.kernel, _PLAIN_SHAPE.num_warps, _PLAIN_CONSTANTS, device,
               *map(_specialization, args))
    compiled = _compiled.get(general)
    if compiled is not None and len(_plain_launches) < 256:
        _plain_launches[key] = (compiled.run, compiled.function, compiled.packed_metadata)


_launch_checked: list[bool] = []  # [whether this Triton and device allow the direct call]


def _fast_launch_allowed() -> bool:
    """Not with a launch hook set (profilers read them), nor where Triton's compiled-kernel
    call differs from the one above (before 3.4) or was not measured (ROCm), nor when turned
    off."""
    if os.environ.get(FAST_LAUNCH_ENV_VAR) == "0":
        return False
    knobs = getattr(triton, "knobs", None)
    if not _launch_checked:
        import torch

        _launch_checked.append(knobs is not None and torch.version.hip is None)
    if not _launch_checked[0] or knobs is None:
        return False
    hooks = (knobs.runtime.launch_enter_hook, knobs.runtime.launch_exit_hook)
    # Triton 3.6 keeps a chain of hooks (empty: none set); earlier versions a function or None.
    return all(hook is None or getattr(hook, "calls", True) == [] for hook in hooks)
