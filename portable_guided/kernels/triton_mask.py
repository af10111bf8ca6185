"""Our Triton kernels for in-place masking of GPU logits, and a low-overhead launcher.

The semantics are xgrammar's: column ``c`` of row ``r`` is masked when bit ``c % 32`` of
``bitmask[r, c // 32]`` is clear. Each kernel runs one program per (row, ``BLOCKS`` blocks of
``BLOCK_SIZE`` columns):

- ``triton-tiered`` (the default): the word kernel below behind one test per block: a block
  whose words all allow everything does no per-column work at all (no address, no mask),
  one whose words all block everything is written without being read, and any other block
  takes the word kernel's path. Once the grid has ``WIDE_MIN_PROGRAMS`` programs of 8,192
  columns, each program takes 8,192 columns instead of 2,048: fewer programs, each as cheap.
- ``triton-word`` (the default before ``triton-tiered``): a block is read as ``(words, 32)``,
  so each bitmask word is loaded once and its bits broadcast over its 32 columns. Load and
  store masks are per word: a word that allows everything is neither read nor written, one
  that blocks everything is written without being read, and only mixed words are read and
  written. A mask constant over each word keeps the loads and stores vectorized (16 bytes a
  thread).
- ``triton-dense``: the same layout with the choice made per block: skip the block, write it
  without reading it, or read and write all of it.
- ``triton-element``: one thread per column, ``-inf`` written through a per-element store
  mask, which defeats vectorization (the default of the first GPU run).

On an H200 (``bench/results/cuda_h200_s32/``, device time, B >= 64): ``triton-tiered`` is
slower than xgrammar's CUDA kernel in 2 of 32 cells, by 1-2% (bf16, V=151,936, B=256:
JSON-like 27.6 against 27.0 us), and up to 1.8x faster in the others (all-allowed masks: 7.9
against 14.0 us at fp32, V=151,936, B=256), where ``triton-word`` was up to 1.76x slower; on
JSON-like masks it reaches 82-150% (fp32) and 49-133% (bf16) of a device-to-device copy's
rate, ``triton-element`` 52-82% and 20-28%.

Triton's own launch spends about 25 us of host time per call binding and specializing the
arguments. :func:`apply_triton` launches the compiled kernel directly once Triton has compiled
it for the same specialization (the pointers' dtypes and 16-byte alignment, the integers'
divisibility by 16, equality to 1 and width) and the same constants; :func:`apply_plain`
does so for the plain call with fewer steps and the pointers as integers.

Imported on first use only (it imports Triton).
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any, NamedTuple

import triton
import triton.language as tl

from . import env_may_be_set

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
    """A kernel and its launch shape: columns per block, warps, blocks per program, and the
    columns per block once the grid has at least ``WIDE_MIN_PROGRAMS`` programs of that many
    (0: never)."""

    kernel: Any
    block: int
    num_warps: int
    blocks: int
    wide_block: int = 0

    def columns(self, rows: int, vocab_size: int) -> int:
        """Columns per block for ``rows`` rows of ``vocab_size`` columns."""
        wide = self.wide_block
        if wide and rows * -(-vocab_size // (wide * self.blocks)) >= WIDE_MIN_PROGRAMS:
            return wide
        return self.block


# Fewer, wider programs pay once the grid fills the GPU: on an H200 an all-allowed B=256
# mask took 4.4-8.0 us with 8,192 columns a program against 7.0-14.9 with 2,048, other masks
# within 0.5 us either way; a small grid (one row) ran 0.3-0.6 us slower wide.
WIDE_MIN_PROGRAMS = 256

VARIANTS = {
    "triton-word": Variant(_word_kernel, BLOCK, 8, 1),
    "triton-dense": Variant(_dense_kernel, BLOCK, 8, 1),
    "triton-element": Variant(_element_kernel, BLOCK, 8, 1),
    "triton-tiered": Variant(_tiered_kernel, BLOCK, 8, 1, wide_block=4 * BLOCK),
}
DEFAULT_VARIANT = "triton-tiered"
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
    blocks = blocks or shape.blocks
    block = block or shape._replace(blocks=blocks).columns(count, vocab_size)
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


# The plain call's launches, by (dtype, device, columns per block, the specialization of its
# pointers and integers): see _direct_launch.
_plain_launches: dict[tuple[Any, ...], Any] = {}
_PLAIN_SHAPE = VARIANTS[DEFAULT_VARIANT]


def apply_plain(table: torch.Tensor, bitmask: torch.Tensor, batch: int, width: int, words: int,
                stride: int, device: int) -> None:
    """:func:`apply_triton` with the default variant over every row of ``table``
    (``batch`` x ``width``, row stride ``stride``, unit column stride) from ``bitmask``
    (``batch`` x ``words``, contiguous, ``32 * words >= width``), both on the current device
    ``device``: the caller has checked all of that. Once the kernel is compiled for this
    specialization, the launch takes the pointers as integers (Triton's launcher then neither
    calls ``data_ptr`` nor asks the driver about them) and skips the general key."""
    table_ptr, mask_ptr = table.data_ptr(), bitmask.data_ptr()
    block = _PLAIN_SHAPE.columns(batch, width)
    # Triton specializes a pointer on 16-byte alignment, an integer on divisibility by 16,
    # equality to 1 and width (32 or 64 bits).
    key = (table.dtype, device, block, table_ptr % 16 == 0, mask_ptr % 16 == 0,
           width % 16 == 0, width == 1, stride % 16 == 0, stride == 1, stride < 2**31,
           words % 16 == 0, words == 1)
    launch = _plain_launches.get(key)
    if launch is None or not _fast_launch_allowed():
        apply_triton(table, bitmask, width, None, device=device)
        _remember_plain(key, table, bitmask, width, device, block)
        return
    import torch

    launch(batch, -(-width // (block * _PLAIN_SHAPE.blocks)),
           torch._C._cuda_getCurrentRawStream(device), table_ptr, mask_ptr, mask_ptr, width,
           stride, words, False, block, _PLAIN_SHAPE.blocks)


def _remember_plain(key: tuple[Any, ...], table: torch.Tensor, bitmask: torch.Tensor,
                    width: int, device: int, block: int) -> None:
    """Keep the plain call's launch for ``key`` once :func:`apply_triton` has compiled it."""
    args = (table, bitmask, bitmask, width, table.stride(0), bitmask.stride(0))
    general = (_PLAIN_SHAPE.kernel, _PLAIN_SHAPE.num_warps, (False, block, _PLAIN_SHAPE.blocks),
               device, *map(_specialization, args))
    compiled = _compiled.get(general)
    if compiled is not None and len(_plain_launches) < 256:
        _plain_launches[key] = _direct_launch(compiled)


def _direct_launch(compiled: Any) -> Any:
    """``launch(grid_x, grid_y, stream, *arguments)`` of a compiled kernel. On Triton 3.6,
    whose launcher this was measured with, a kernel that needs no scratch memory goes straight
    to the launcher's C function (Triton's Python wrapper around it costs about 1 us of host
    time: it allocates nothing for such a kernel); elsewhere through that wrapper."""
    run, function, metadata = compiled.run, compiled.function, compiled.packed_metadata
    c_launch = getattr(run, "launch", None)
    if (triton.__version__.startswith("3.6.") and c_launch is not None
            and getattr(run, "global_scratch_size", 1) == 0
            and getattr(run, "profile_scratch_size", 1) == 0):
        cooperative, pdl = run.launch_cooperative_grid, run.launch_pdl

        def launch(grid_x: int, grid_y: int, stream: int, *arguments: Any) -> None:
            c_launch(grid_x, grid_y, 1, stream, function, cooperative, pdl, None, None,
                     metadata, None, None, None, *arguments)

        return launch

    def launch_wrapped(grid_x: int, grid_y: int, stream: int, *arguments: Any) -> None:
        run(grid_x, grid_y, 1, stream, function, metadata, None, None, None, *arguments)

    return launch_wrapped


_launch_checked: list[bool] = []  # [whether this Triton and device allow the direct call]


def _fast_launch_allowed() -> bool:
    """Not with a launch hook set (profilers read them), nor where Triton's compiled-kernel
    call differs from the one above (before 3.4) or was not measured (ROCm), nor when turned
    off."""
    if not _launch_checked:
        import torch

        knobs = getattr(triton, "knobs", None)
        # The knobs first: another thread reads them once it sees the check.
        _runtime_knobs.append(None if knobs is None else knobs.runtime)
        _launch_checked.append(knobs is not None and torch.version.hip is None)
    if not _launch_checked[0] or env_may_be_set(FAST_LAUNCH_ENV_VAR) and os.environ.get(
            FAST_LAUNCH_ENV_VAR) == "0":
        return False
    runtime = _runtime_knobs[0]
    enter, exit_ = runtime.launch_enter_hook, runtime.launch_exit_hook
    # Triton 3.6 keeps a chain of hooks (empty: none set); earlier versions a function or None.
    return ((enter is None or getattr(enter, "calls", True) == [])
            and (exit_ is None or getattr(exit_, "calls", True) == []))


_runtime_knobs: list[Any] = []  # [triton.knobs.runtime], read on first use
