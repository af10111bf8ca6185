"""Ahead-of-time compilation of the static-shape apply graphs: one graph per batch bucket.

On graph-compiled devices (XLA/TPU) the first ``apply_token_mask`` for a new logits shape
compiles a graph, which stalls a decode step for the length of a compilation. Engines pad their
batch to a bucket (:func:`portable_guided.bucket_sizes`), so the set of shapes is known ahead of
time: :func:`precompile` runs every bucket's graph once at deploy time, reports how many graphs
each bucket compiled and how long it took, and writes the executables to a persistent
compilation cache so that later processes can load instead of compile (where the runtime can:
see ``docs/xla.md`` for torch_xla 2.9, which writes the cache but cannot load it).

Example::

    from portable_guided.precompile import precompile
    report = precompile(max_batch=256, vocab=151936, dtype="bfloat16", cache_dir="/var/cache/pg")
    print(report.format_table())

or, from a shell: ``portable-guided precompile --max-batch 256 --vocab 151936 --cache-dir DIR``.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any, Protocol, TextIO

from .buckets import bucket_sizes
from .registry import available_platforms, get_platform

if TYPE_CHECKING:
    import torch

__all__ = ["DTYPES", "BucketReport", "CompileStats", "PrecompileReport", "precompile"]

DTYPES = ("float32", "bfloat16", "float16")


@dataclass(frozen=True)
class CompileStats:
    """Cumulative compilation activity of the process (XLA only; subtract two for a window).

    Attributes:
        compiles: graphs compiled (torch_xla's ``UncachedCompile`` counter).
        compile_seconds: time spent compiling (sum of ``CompileTime``).
        cache_hits: executables loaded from the persistent cache (``PersistentCacheHit``).
        cache_misses: graphs not found in the persistent cache (``PersistentCacheMiss``).
        cache_load_failures: graphs found in the cache that the runtime could not load
            (``PersistentCacheDeserializeFailure``); they were compiled again.
    """

    compiles: int = 0
    compile_seconds: float = 0.0
    cache_hits: int = 0
    cache_misses: int = 0
    cache_load_failures: int = 0

    def __sub__(self, other: CompileStats) -> CompileStats:
        return CompileStats(
            self.compiles - other.compiles,
            self.compile_seconds - other.compile_seconds,
            self.cache_hits - other.cache_hits,
            self.cache_misses - other.cache_misses,
            self.cache_load_failures - other.cache_load_failures,
        )


@dataclass(frozen=True)
class BucketReport:
    """One bucket: its row count, wall time, and (where countable) what compiled."""

    rows: int
    seconds: float
    stats: CompileStats | None

    @property
    def graphs_compiled(self) -> int | None:
        """Graphs this bucket compiled (``None`` where the device does not count them)."""
        return None if self.stats is None else self.stats.compiles


@dataclass(frozen=True)
class PrecompileReport:
    """What :func:`precompile` did, per bucket and in total."""

    platform: str
    device: str
    dtype: str
    vocab: int
    cache_dir: str | None
    buckets: tuple[BucketReport, ...]
    seconds: float
    cache_files: int | None

    @property
    def graphs_compiled(self) -> int | None:
        """Graphs compiled over all buckets (``None`` where not countable)."""
        counts = [b.graphs_compiled for b in self.buckets]
        return None if None in counts else sum(counts)  # type: ignore[arg-type]

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dictionary (``json.dumps(report.to_dict())``)."""
        data = asdict(self)
        data["graphs_compiled"] = self.graphs_compiled
        return data

    def format_table(self) -> str:
        """A short human-readable table, one line per bucket and a total."""
        header = (f"precompile: platform={self.platform} device={self.device} "
                  f"dtype={self.dtype} vocab={self.vocab} cache={self.cache_dir or 'none'}")
        lines = [header,
                 f"{'bucket':>7} {'graphs':>7} {'seconds':>8} {'compile s':>10} {'cache':>18}"]
        for bucket in self.buckets:
            lines.append(_bucket_line(bucket))
        total = self.graphs_compiled
        lines.append(f"{'total':>7} {'-' if total is None else total:>7} {self.seconds:8.2f}"
                     + (f"   ({self.cache_files} files in the cache)" if self.cache_files is not None else ""))
        return "\n".join(lines)


def _bucket_line(bucket: BucketReport) -> str:
    stats = bucket.stats
    if stats is None:
        return f"{bucket.rows:>7} {'-':>7} {bucket.seconds:8.2f}"
    cache = f"{stats.cache_hits} hit/{stats.cache_misses} miss"
    if stats.cache_load_failures:
        cache += f"/{stats.cache_load_failures} unloadable"
    return (f"{bucket.rows:>7} {stats.compiles:>7} {bucket.seconds:8.2f} "
            f"{stats.compile_seconds:10.2f} {cache:>18}")


class _Runtime(Protocol):
    """What ``precompile`` needs from a device: a platform's ``precompile`` hook returns one
    (XLA: ``portable_guided.platforms.xla.XlaPrecompile``); eager devices get
    :class:`_EagerRuntime`. A runtime may also have ``warmup(rows, width, dtype, device)``
    (JAX: ``portable_guided.platforms.jax.JaxPrecompile``), used instead of running the Torch
    graph once."""

    def device(self, requested: str | None) -> Any: ...

    def stats(self) -> CompileStats | None: ...

    def sync(self) -> None: ...


class _EagerRuntime:
    """Other static-shape torch devices (XPU, NPU, CPU when forced): nothing is compiled ahead
    of time by torch, so there is nothing to count or cache; warming still allocates and runs
    each bucket once."""

    def __init__(self, cache_dir: str | None, device_type: str) -> None:
        if cache_dir is not None:
            raise ValueError(
                f"cache_dir is only supported on {', '.join(_platforms_with('precompile'))}, "
                f"got platform device {device_type!r}"
            )
        self._device_type = device_type

    def device(self, requested: str | None) -> torch.device:
        import torch

        return torch.device(requested or self._device_type)

    def stats(self) -> None:
        return None

    def sync(self) -> None:
        import torch

        module = getattr(torch, self._device_type, None)
        if module is not None and hasattr(module, "synchronize"):
            module.synchronize()


def _platforms_with(hook: str | None = None) -> list[str]:
    """Names of the static-shape platforms (with that hook, if given)."""
    names = []
    for name in available_platforms():
        spec = get_platform(name)
        if spec.static_shapes and (hook is None or hook in spec.hooks):
            names.append(name)
    return names


def _progress(sizes: tuple[int, ...], enabled: bool, stream: TextIO) -> Iterable[int]:
    if not enabled:
        return sizes
    try:
        from tqdm import tqdm
    except ImportError:
        return sizes
    return tqdm(sizes, desc="precompile", unit="bucket", file=stream, leave=False)


def _emit(line: str, stream: TextIO) -> None:
    try:
        from tqdm import tqdm
    except ImportError:
        print(line, file=stream, flush=True)
    else:
        tqdm.write(line, file=stream)


def precompile(
    *,
    max_batch: int,
    vocab: int,
    dtype: str = "bfloat16",
    platform: str = "xla",
    min_bucket: int = 8,
    cache_dir: str | os.PathLike[str] | None = None,
    device: str | None = None,
    progress: bool = True,
    stream: TextIO | None = None,
) -> PrecompileReport:
    """Compile the apply graph of every batch bucket up to ``max_batch``.

    Args:
        max_batch: the largest batch the engine runs; buckets are
            ``bucket_sizes(max_batch, min_bucket)``.
        vocab: the logits' width (columns), e.g. the model's padded vocabulary. The graphs do
            not depend on the ``vocab_size`` passed to ``apply_token_mask``.
        dtype: the logits' dtype name: ``float32``, ``bfloat16`` or ``float16``.
        platform: a static-shape platform (built in: ``xla``, ``jax``, ``xpu``, ``npu``,
            ``static``).
        min_bucket: the smallest bucket.
        cache_dir: persistent compilation cache, for platforms with a ``precompile`` hook
            (XLA, JAX); created if missing. Must be given before this process runs any other XLA
            computation.
        device: device string; default: the platform's device.
        progress: show a progress bar and one line per bucket on ``stream``.
        stream: where progress goes (default ``sys.stderr``).

    Returns:
        A :class:`PrecompileReport` with graphs compiled and seconds per bucket.

    Raises:
        ValueError: unknown dtype, a platform without static shapes, or bad bucket sizes.
        RuntimeError: ``cache_dir`` given after this process already used XLA.
    """
    stream = sys.stderr if stream is None else stream
    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {', '.join(DTYPES)}, got {dtype!r}")
    if isinstance(vocab, bool) or not isinstance(vocab, int) or vocab < 1:
        raise ValueError(f"vocab must be a positive int, got {vocab!r}")
    sizes = bucket_sizes(max_batch, min_bucket)
    spec = get_platform(platform)
    if not spec.static_shapes:
        raise ValueError(
            f"precompile applies to static-shape platforms ({', '.join(_platforms_with())}); "
            f"{platform!r} uses {spec.strategy!r} and compiles nothing per shape"
        )
    cache = None if cache_dir is None else os.fspath(cache_dir)
    compiled = spec.hook("precompile")  # a device that counts and caches its graphs (XLA)
    runtime: _Runtime
    if compiled is not None:
        runtime = compiled(cache)
    else:
        runtime = _EagerRuntime(cache, (device or next(iter(spec.device_types), "cpu")).split(":")[0])

    target = runtime.device(device)
    warmup = _warmup_of(runtime, dtype)
    reports = []
    start = time.perf_counter()
    for rows in _progress(sizes, progress, stream):
        before, t0 = runtime.stats(), time.perf_counter()
        warmup(rows, vocab, target)
        runtime.sync()
        after = runtime.stats()
        bucket = BucketReport(rows, time.perf_counter() - t0,
                              None if after is None or before is None else after - before)
        reports.append(bucket)
        if progress:
            _emit(_bucket_line(bucket), stream)
    return PrecompileReport(
        platform=spec.name,
        device=str(target),
        dtype=dtype,
        vocab=vocab,
        cache_dir=cache,
        buckets=tuple(reports),
        seconds=time.perf_counter() - start,
        cache_files=None if cache is None else sum(1 for _ in _files(cache)),
    )


def _warmup_of(runtime: _Runtime, dtype: str) -> Callable[[int, int, Any], None]:
    """``warmup(rows, width, device)`` for one bucket: the runtime's own (JAX compiles its
    executables ahead of time) or, by default, one run of the Torch static-shape graph."""
    own = getattr(runtime, "warmup", None)
    if own is not None:
        return lambda rows, width, target: own(rows, width, dtype, target)
    import torch

    from .kernels.static_torch import warmup

    torch_dtype = getattr(torch, dtype)
    return lambda rows, width, target: warmup(rows, width, torch_dtype, target)


def _files(directory: str) -> Iterator[str]:
    for _, _, names in os.walk(directory):
        yield from names
