"""The compiled CPU kernel (``_cpu_mask.c``): one pass over each masked row.

Built with the package where a C compiler is found (``setup.py``; optional), it is the CPU
platform's kernel for every framework; without it ``kernels/host.py`` masks with NumPy. It
looks at each 32-token bitmask word once: all-allowed words cost a read of the word,
all-blocked words a write of -inf, words with a few blocked tokens a store per blocked token,
other words a branch-free select. So a JSON-like row costs one write pass and no row ever
costs more than one read and write of its logits.

Threads: the kernel joins the OpenMP team of the framework already loaded in the process
(Torch's libgomp), instead of starting threads that would compete with that team's threads,
which keep spinning for a while after each op (bench/results/apply_cpu_after_matmul_s6.json,
B=64 fp32 JSON-like masks at V=129,280: 3.06 ms on the calling thread, 1.69 ms in Torch's
team of two, 3.21 ms with a second thread of our own). Where no OpenMP runtime is loaded (NumPy-only processes), large work is
split over the NumPy kernel's thread pool. ``PORTABLE_GUIDED_CPU_THREADS=N`` sets the thread
count (1: the calling thread only).

The team is woken only when it pays (the kernel decides, ``_cpu_mask.team_stats``): work
under 1,024 bitmask words that block a token (an all-allowed batch) stays on the calling
thread, and after a team whose last member started more than 0.5 ms late (its core was busy
with another process) the next calls run on the calling thread, 16 at first, doubling while
the team stays late. On the shared 2-core machine (load average about 3) joining the team
had cost 7-35 ms per call where one thread took 1.3 ms (bench/bench_sglang.py
--kernel-threads, bench/results/sglang_cpu_s8.json).
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from ..validation import MaskPlan
from . import plain_torch_pair
from .host_common import NEG_INF_BITS, THREADS_ENV_VAR, _run_split, _split_rows, _threads

__all__ = ["KERNEL_ENV_VAR", "available", "apply_compiled", "apply_plain_torch", "describe"]

# "numpy" forces the NumPy kernel even where the compiled one is built (for comparison);
# "compiled" makes its absence an error instead of a silent fallback.
KERNEL_ENV_VAR = "PORTABLE_GUIDED_CPU_KERNEL"

# Work smaller than this many tokens stays on the calling thread (Torch's own grain size for
# parallel ops). Above it the team was never slower, even at one row of 49k tokens, since
# right after a forward its threads are still spinning (bench/bench_apply.py --position
# after-matmul --batches 1,2,4,8 --impls ours-1t,ours-team).
PARALLEL_MIN_TOKENS = 1 << 15

_module: Any = None
_checked = False


def available() -> bool:
    """Whether the compiled kernel is built and not turned off by ``KERNEL_ENV_VAR``."""
    global _module, _checked
    choice = os.environ.get(KERNEL_ENV_VAR, "")
    if choice not in ("", "compiled", "numpy"):
        raise ValueError(f"{KERNEL_ENV_VAR} must be 'compiled' or 'numpy', got {choice!r}")
    if choice == "numpy":
        return False
    if not _checked:
        try:
            from . import _cpu_mask

            _module = _cpu_mask
        except ImportError:  # built without a C compiler
            _module = None
        _checked = True
    if _module is None and choice == "compiled":
        raise ImportError(f"{KERNEL_ENV_VAR}=compiled, but portable_guided was installed "
                          "without its compiled CPU kernel (no C compiler at install time); "
                          "reinstall with a C compiler, or unset it to use the NumPy kernel")
    return _module is not None


def describe() -> str:
    """One line for operators (``portable-guided doctor``): which CPU kernel serves host
    logits and, for the compiled one, which OpenMP runtime's threads it joins."""
    if os.environ.get(KERNEL_ENV_VAR) == "numpy":
        return f"NumPy ({KERNEL_ENV_VAR}=numpy)"
    if not available():
        return "NumPy (the compiled kernel was not built: no C compiler at install time)"
    runtime = _module.openmp_runtime()
    team = f"joins the {runtime} OpenMP team" if runtime else "no OpenMP runtime loaded: own threads"
    return f"compiled ({team})"


def apply_compiled(bits: np.ndarray, bitmask: np.ndarray, plan: MaskPlan) -> None:
    """Mask ``bits`` (a 2-D NumPy array over the logits' memory, of any 2- or 4-byte items:
    ``dlpack.host_array``) in place from the int32 ``bitmask`` (2-D, ``plan.bitmask_rows``
    rows). Call only when :func:`available`.

    Right after a forward this runs with cold caches, where each Python step costs tens of
    microseconds (more than masking an all-allowed batch), so the path is kept short."""
    rows = plan.rows if plan.rows is not None else _every_row(plan.batch)
    if bitmask.strides[-1] != bitmask.itemsize:
        bitmask = np.ascontiguousarray(bitmask)
    threads = _threads() if os.environ.get(THREADS_ENV_VAR) else 0  # 0: the team's default
    if rows.size * plan.vocab_size < PARALLEL_MIN_TOKENS:
        threads = 1
    neg = NEG_INF_BITS[plan.dtype]
    if threads != 1 and _module.openmp_runtime() is None:
        # No framework team to join: split the rows over the kernel's own threads.
        def mask(piece: tuple[int, int]) -> None:
            part = rows[piece[0] : piece[1]]
            _module.mask_rows(bits, bitmask, part, part, plan.vocab_size, neg, 1)

        pieces = _split_rows(0, rows.size, threads or _threads())
        _run_split(mask, pieces, rows.size * plan.vocab_size * bits.itemsize)
        return
    _module.mask_rows(bits, bitmask, rows, rows, plan.vocab_size, neg, threads)


def apply_plain_torch(logits: Any, bitmask: Any) -> bool:
    """Mask the most common call with few Python steps: 2-D contiguous Torch CPU logits
    (float32, bfloat16 or float16, no autograd) and a 2-D contiguous int32 CPU bitmask with
    one row per logits row covering every column; no indices, no ``vocab_size``. Such a call
    cannot fail validation, so the checks of :func:`~portable_guided.validation.plan_mask`
    reduce to these. Returns False, having done nothing, for any other call (the general path
    then checks and masks it); the caller has checked that the registry would choose this
    kernel. Right after a forward, each Python step costs microseconds: the general path took
    about 50 us beyond the kernel at B=64 (bench/bench_sglang.py, all-allowed cells)."""
    torch = plain_torch_pair(logits, bitmask)
    if torch is None:
        return False
    dtype = logits.dtype
    neg = _PLAIN_NEG.get(str(dtype)) if dtype != torch.bfloat16 else 0xFF80
    if (neg is None or bitmask.dtype != torch.int32 or not logits.is_cpu
            or not bitmask.is_cpu or logits.dim() != 2 or bitmask.dim() != 2):
        return False
    batch, width = logits.shape
    if (bitmask.shape[0] != batch or 32 * bitmask.shape[1] < width or width == 0
            or logits.requires_grad or not logits.is_contiguous()
            or not bitmask.is_contiguous() or not available()):
        return False
    threads = _threads() if os.environ.get(THREADS_ENV_VAR) else 0
    if batch * width < PARALLEL_MIN_TOKENS:
        threads = 1
    elif threads != 1 and _module.openmp_runtime() is None:
        return False  # no team to join: apply_compiled splits the rows over its threads
    bits = (logits.view(torch.int16) if dtype == torch.bfloat16 else logits).numpy()
    _module.mask_rows(bits, bitmask.numpy(), _every_row(batch), _every_row(batch), width, neg,
                      threads)
    return True


_PLAIN_NEG = {"torch.float32": NEG_INF_BITS["float32"], "torch.float16": NEG_INF_BITS["float16"]}
_row_ranges: dict[int, np.ndarray] = {}


def _every_row(batch: int) -> np.ndarray:
    """``arange(batch)`` as int64, made once per batch size (read-only: shared)."""
    rows = _row_ranges.get(batch)
    if rows is None:
        rows = np.arange(batch, dtype=np.int64)
        rows.flags.writeable = False
        if len(_row_ranges) < 1024:  # engines use a few batch sizes; bound it anyway
            _row_ranges[batch] = rows
    return rows
