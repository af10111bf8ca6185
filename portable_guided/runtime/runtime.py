"""The engine-facing entry point: :class:`GrammarRuntime`."""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
import weakref
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import numpy as np

from ..validation import int_list
from .cache import GrammarCache
from .cache_setup import open_cache
from .compile_service import CompiledGrammar, CompileService
from .engines import DEFAULT_ENGINE, Engine, Matcher
from .fill_pool import FillPool
from .metrics import Metrics
from .request import ON_ERROR_POLICIES, ReasoningConfig, Request, RequestContext
from .rows import SpecialRows, as_numpy_bitmask
from .specs import GrammarSpec
from .tokenizer_info import TokenizerInfo, load_tokenizer_info

__all__ = ["GrammarRuntime"]

# Mean row cost above which batches go to our FillPool rather than the engine's batch call
# (bench/maskbench_targets.py: at 8-12 us a row xgrammar's call ran 1.13-1.49x and the pool
# 0.9-1.17x; at 175 us a row, ordered longest first, the pool ran 1.67-1.73x and the call
# 1.25x; at 26 us (a decode walk) both 1.29x).
_POOL_MIN_ROW_S = 30e-6


_Job = tuple[Request, Matcher, int]  # a request, its matcher, its bitmask row


def _by_cost(job: _Job) -> float:
    return job[0].fill_cost_s


class GrammarRuntime:
    """Compiles grammars in the background and fills bitmasks for batches of requests.

    >>> rt = GrammarRuntime(load_tokenizer_info("deepseek"), engine="xgrammar")  # doctest: +SKIP
    >>> req = rt.new_request(GrammarSpec.json_schema({"type": "object"}))       # doctest: +SKIP
    >>> bitmask = rt.allocate_bitmask(8)                                         # doctest: +SKIP
    >>> rt.fill_bitmask([req, None], bitmask)  # row 1 stays all-allowed         # doctest: +SKIP

    Parameters: ``engine`` is ``"auto"`` (default: the engines of ``auto_order`` in turn,
    the next one when one refuses a spec, within one time limit), ``"xgrammar"`` or
    ``"llguidance"``;
    ``compile_timeout_s`` is a real limit counted from submission (the compile runs in a
    worker process, killed at the deadline; at most ``compile_workers`` run at normal
    priority, a spare waits, long compiles move to a low-priority lane: docs/latency.md,
    "Latency model"; the workers start now, in the background), ``None`` compiles in
    threads without a limit; ``fill_threads`` threads fill a batch whose masks are estimated to cost at least
    ``parallel_fill_min_us`` (cheaper steps are filled in the calling thread, since handing
    them to threads costs more than it saves); ``cache_bytes`` bounds the in-memory cache
    of compiled grammars; ``disk_cache_dir`` enables the on-disk cache shared by processes
    and tensor-parallel ranks, ``cache_url`` (``redis://host:port/db``) the one shared by a
    fleet (Redis over the directory, if any), entries authenticated under ``cache_secret``,
    ``cache_shared=True`` for a directory shared on purpose (defaults:
    ``$PORTABLE_GUIDED_CACHE_URL``, ``$PORTABLE_GUIDED_CACHE_SECRET``,
    ``$PORTABLE_GUIDED_CACHE_SHARED``; docs/cache.md; a ``GrammarCache`` may be passed as
    ``disk_cache_dir``); failed compiles are remembered for ``failure_ttl_s`` (with a
    fleet cache, for the whole fleet);
    ``engine_upgrade`` (default on; ``auto`` with a limit only): a JSON schema ``auto``
    compiled with llguidance is compiled with xgrammar in the background as soon as it is
    ready; later requests get xgrammar's faster masks, and running ones move to them as
    it lands, in its thread (``CompileService``, ``Request.hand_over``; docs/latency.md,
    "Engine upgrades");
    ``engine_prewarm`` (default on, with the upgrades): at start, a background thread at
    the lowest priority compiles the rules that recur across JSON schemas (length bounds,
    formats, open objects' names) with xgrammar, about 28 s of one core and 320 MiB of its
    compiler cache, so that a new schema's upgrade finds their token masks computed
    (docs/latency.md, "Engine upgrades");
    ``compile_race=True`` races each worker compile with the same compile in this process
    for about one compile's latency instead of the worker's round trip (it costs a second
    core per compile and can leave a never-ending compile running in this process: see
    ``CompileService``).
    """

    def __init__(
        self,
        tokenizer_info: TokenizerInfo | str,
        engine: str = DEFAULT_ENGINE,
        *,
        compile_timeout_s: float | None = 30.0,
        fill_threads: int = 2,
        cache_bytes: int = 512 << 20,
        disk_cache_dir: str | GrammarCache | None = None,
        compile_workers: int = 1,
        failure_ttl_s: float = 30.0,
        auto_order: tuple[str, ...] = ("llguidance", "xgrammar"),
        local_recompile_below_s: float = 0.1,
        parallel_fill_min_us: float = 400.0,
        compile_race: bool = False,
        cache_url: str | None = None,
        cache_secret: str | bytes | None = None,
        cache_shared: bool | None = None,
        engine_upgrade: bool = True,
        engine_prewarm: bool = True,
    ) -> None:
        if isinstance(tokenizer_info, str):
            tokenizer_info = load_tokenizer_info(tokenizer_info)
        if not isinstance(tokenizer_info, TokenizerInfo):
            raise TypeError(
                f"tokenizer_info must be a TokenizerInfo or a tokenizer name, got "
                f"{type(tokenizer_info).__name__}"
            )
        if not isinstance(fill_threads, int) or fill_threads < 1:
            raise ValueError(f"fill_threads must be an int >= 1, got {fill_threads!r}")
        self.info = tokenizer_info
        self.fill_threads = fill_threads
        self.parallel_fill_min_s = parallel_fill_min_us * 1e-6
        # Moving average of one row's fill time (seconds, as if filled by one thread).
        self._row_cost = 0.0
        self.metrics_sink = Metrics()
        if not isinstance(disk_cache_dir, GrammarCache):
            disk_cache_dir = open_cache(disk_cache_dir, url=cache_url, secret=cache_secret,
                                        shared=cache_shared)
        self._service = CompileService(
            tokenizer_info, engine=engine, auto_order=auto_order, timeout_s=compile_timeout_s,
            workers=compile_workers, fill_threads=fill_threads, cache_bytes=cache_bytes,
            disk_cache_dir=disk_cache_dir, failure_ttl_s=failure_ttl_s,
            local_below_s=local_recompile_below_s, metrics=self.metrics_sink,
            race=compile_race, upgrade=engine_upgrade, prewarm=engine_prewarm,
        )
        self._executor = ThreadPoolExecutor(4, thread_name_prefix="pg-runtime")
        self._serials = iter(range(1 << 62))
        self._serial_lock = threading.Lock()
        #: The rows no grammar fills (stop tokens only; the reasoning phase).
        self.special_rows = SpecialRows(tokenizer_info)
        self._request_context = RequestContext(
            rows=self.special_rows, metrics=self.metrics_sink, executor=self._executor,
            next_serial=self._next_serial, discard=self._service.discard,
        )
        self._fill_pools: list[FillPool] = []  # at most one; a list so _shutdown sees it
        self._pool_lock = threading.Lock()
        self._finalizer = weakref.finalize(self, _shutdown, self._service, self._executor,
                                          self._fill_pools)

    # -- shape -----------------------------------------------------------------------------
    @property
    def engine(self) -> str:
        """The engine choice (``xgrammar``, ``llguidance`` or ``auto``)."""
        return self._service.engine_choice

    @property
    def vocab_size(self) -> int:
        """The model's vocabulary width (bitmask columns cover it)."""
        return self.info.vocab_size

    @property
    def bitmask_words(self) -> int:
        """int32 words per bitmask row: ``ceil(vocab_size / 32)``."""
        return self.info.bitmask_words

    def allocate_bitmask(self, rows: int) -> np.ndarray:
        """A ``(rows, bitmask_words)`` int32 NumPy array with every bit set (all allowed)."""
        if not isinstance(rows, int) or rows < 1:
            raise ValueError(f"rows must be an int >= 1, got {rows!r}")
        return np.full((rows, self.bitmask_words), -1, dtype=np.int32)

    # -- compiling -------------------------------------------------------------------------
    def compile_async(self, spec: GrammarSpec) -> Future[CompiledGrammar]:
        """Start compiling ``spec`` (or find it cached); never blocks."""
        return self._service.submit(spec)

    def upgrade_state(self, spec: GrammarSpec) -> str | None:
        """How ``spec``'s engine upgrade went (``engine_upgrade``): ``"running"``,
        ``"done"``, ``"failed"``, ``"dropped"`` or None (``CompileService.upgrade_state``)."""
        return self._service.upgrade_state(spec)

    def warm(self) -> None:
        """Build this process's engines (their tokenizer conversions, 100-200 ms of native
        code holding the GIL for a large vocabulary) and return when they are built; raises
        the engine's error. The runtime starts building them in the background when it is
        constructed; a server calls this while it starts, so that no request, and no event
        loop, waits for it."""
        self._service.warm()

    def compile(self, spec: GrammarSpec, timeout: float | None = None) -> CompiledGrammar:
        """Compile ``spec`` and wait for it; raises the compile error."""
        return self._service.submit(spec).result(timeout)

    async def acompile(self, spec: GrammarSpec) -> CompiledGrammar:
        """Await the compiled ``spec`` without blocking the event loop."""
        return await asyncio.wrap_future(self._service.submit(spec))

    def new_request(
        self,
        spec: GrammarSpec,
        on_error: str = "raise",
        reasoning: ReasoningConfig | None = None,
    ) -> Request:
        """A request constrained by ``spec``; its compile starts now, in the background.

        Raises ``TypeError``/``ValueError`` for bad arguments and :class:`RuntimeClosed`
        after :meth:`close`."""
        if on_error not in ON_ERROR_POLICIES:
            raise ValueError(f"on_error must be one of {ON_ERROR_POLICIES}, got {on_error!r}")
        if reasoning is not None:
            if not isinstance(reasoning, ReasoningConfig):
                raise TypeError(
                    f"reasoning must be a ReasoningConfig, got {type(reasoning).__name__}")
            bad = [t for t in reasoning.think_end_ids if not 0 <= t < self.vocab_size]
            if bad:
                raise ValueError(f"think_end_ids {bad[:5]} out of range [0, {self.vocab_size})")
        future = self._service.submit(spec)
        self.metrics_sink.inc("requests")
        return Request(future, self._request_context, on_error=on_error, reasoning=reasoning)

    # -- filling ---------------------------------------------------------------------------
    def fill_bitmask(
        self,
        requests: Sequence[Request | None],
        bitmask: Any,
        rows: Sequence[int] | None = None,
    ) -> None:
        """Fill one bitmask row per request, with the engines' multi-threaded batch fill.

        Row ``rows[i]`` (default ``i``) of ``bitmask`` (int32 ``(R, bitmask_words)``, NumPy or
        a CPU Torch tensor) gets ``requests[i]``'s mask. ``None`` entries (unconstrained)
        are set all-allowed; requests still compiling or in prefill are skipped (row left
        untouched); failed and terminated requests allow only the stop tokens; thinking
        requests allow every token but the stop tokens (or the forced think-end token).
        """
        t0 = time.perf_counter()
        bm = as_numpy_bitmask(bitmask, self.bitmask_words)
        n = len(requests)
        row_list = _check_rows(rows, n, bm.shape[0])
        strays = [type(r).__name__ for r in requests if r is not None and not isinstance(r, Request)]
        if strays:
            raise TypeError(f"requests must be Request objects or None, got {strays[:3]}")
        live: list[tuple[Request, int]] = []
        for req, row in zip(requests, row_list):
            if req is None:
                bm[row] = -1
            elif not req.in_prefill:
                live.append((req, row))
        live.sort(key=lambda item: item[0].serial)  # one global lock order: no deadlocks
        # Threads pay off only when the step's masks cost more than the handoff to them (a
        # few hundred us); cheap steps are filled in this thread. Each request's last mask
        # time predicts its next one.
        threaded = self.fill_threads > 1 and len(live) > 1 and sum(
            req.fill_cost_s or self._row_cost for req, _ in live
        ) >= self.parallel_fill_min_s
        # Our pool times each row (so the next batch starts with the costliest) but pays a GIL
        # handoff per row; below ~30 us a row, the engine's own batch call is faster.
        pool_rows = threaded and self._row_cost >= _POOL_MIN_ROW_S
        pooled: list[_Job] = []
        costs: list[float] = []
        groups: dict[int, tuple[Engine, list[_Job]]] = {}
        chunks: dict[int, tuple[Engine, list[_Job]]] = {}
        n_rows = 0
        filled: list[tuple[Request, int, bool]] = []  # checked after the engines ran
        perf = time.perf_counter
        t_fill = perf()
        with contextlib.ExitStack() as held:
            for req, row in live:
                held.enter_context(req.fill_lock)
                matcher = req.fill_target(bm, row)
                engine = req.engine
                if matcher is None or engine is None:
                    continue  # written by fill_target (or left pending)
                n_rows += 1
                filled.append((req, row, engine.matcher_errors))
                if not threaded:
                    chunks.setdefault(id(engine), (engine, []))[1].append((req, matcher, row))
                elif pool_rows and engine.fill_releases_gil:
                    pooled.append((req, matcher, row))
                else:
                    groups.setdefault(id(engine), (engine, []))[1].append((req, matcher, row))
            # A cheap step: one library call per engine on this thread (no Python per row).
            for engine, jobs in chunks.values():
                t_chunk = perf()
                engine.fill_chunk([m for _, m, _ in jobs], bm, [row for _, _, row in jobs])
                each = (perf() - t_chunk) / len(jobs)
                for req, _, _ in jobs:
                    req.fill_cost_s = each
            # Longest first: an expensive mask started last leaves the other threads idle.
            if pooled:
                pooled.sort(key=_by_cost, reverse=True)
                costs = self._pool().run([(m, row) for _, m, row in pooled], bm)
                for (req, _, _), cost in zip(pooled, costs):
                    req.fill_cost_s = cost
            for engine, jobs in groups.values():
                jobs.sort(key=_by_cost, reverse=True)
                engine.fill_batch([m for _, m, _ in jobs], bm, [row for _, _, row in jobs])
            if n_rows:
                # One pass over the bitmask finds rows the engines left all zeros (dead ends);
                # int64 words halve the work.
                wide = bm.view(np.int64) if bm.shape[1] % 2 == 0 else bm
                alive: list[bool] = np.asarray(wide.any(axis=1)).tolist()
                for req, row, can_fail in filled:
                    if can_fail or not alive[row]:
                        req.check_filled(bm, row, empty=not alive[row])
        if n_rows:
            if pooled and not groups:  # the pool's row times are exact
                per_row = sum(costs) / len(pooled)
            else:  # wall time as if on one thread (an upper bound when threaded)
                per_row = (perf() - t_fill) / n_rows
                if threaded:
                    per_row *= min(self.fill_threads, n_rows)
            self._row_cost = per_row if not self._row_cost else (
                0.8 * self._row_cost + 0.2 * per_row)
        self.metrics_sink.record_fill(n, time.perf_counter() - t0)

    def _pool(self) -> FillPool:
        """The fill threads, started on the first batch that needs them."""
        with self._pool_lock:
            if not self._fill_pools:
                self._fill_pools.append(FillPool(self.fill_threads))
            return self._fill_pools[0]

    async def afill_bitmask(
        self,
        requests: Sequence[Request | None],
        bitmask: Any,
        rows: Sequence[int] | None = None,
    ) -> None:
        """:meth:`fill_bitmask` in the runtime's executor (the event loop stays responsive)."""
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(self._executor, self.fill_bitmask, requests, bitmask, rows)

    # -- misc ------------------------------------------------------------------------------
    def _next_serial(self) -> int:
        with self._serial_lock:
            return next(self._serials)

    def metrics(self) -> dict[str, Any]:
        """Counters and timings as a plain dict (compile time, cache hits, time-outs, fill
        time per step, rejected tokens...)."""
        out = self.metrics_sink.snapshot()
        out["cache_bytes"], out["cache_entries"] = self._service.cache_usage()
        return out

    def worker_pids(self, *, busy: bool = False) -> list[int]:
        """Process ids of the live compile workers (``busy``: only those running a compile,
        the oldest compile first)."""
        return self._service.worker_pids(busy=busy)

    def close(self) -> None:
        """Stop the compile workers and threads (also done at garbage collection). Pending
        compiles fail at once with :class:`RuntimeClosed` (their requests fail with it), and
        :meth:`new_request` and the compile methods refuse new work with it."""
        self._finalizer()

    def __enter__(self) -> GrammarRuntime:  # noqa: PYI034 - final class in practice
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _shutdown(service: CompileService, executor: ThreadPoolExecutor,
              fill_pools: list[FillPool]) -> None:
    service.close()
    executor.shutdown(wait=False, cancel_futures=True)
    for pool in fill_pools:
        pool.close()


def _check_rows(rows: Sequence[int] | None, n: int, capacity: int) -> list[int]:
    """The bitmask row of each of ``n`` requests (default ``0..n-1``), validated."""
    if rows is None:
        if n > capacity:
            raise ValueError(f"{n} requests but the bitmask has only {capacity} rows")
        return list(range(n))
    row_list = int_list(rows, "rows")
    if len(row_list) != n:
        raise ValueError(f"rows has {len(row_list)} entries for {n} requests")
    bad = [r for r in row_list if not 0 <= r < capacity]
    if bad:
        raise ValueError(f"rows {bad[:5]} out of range for a bitmask of {capacity} rows")
    if len(set(row_list)) != n:
        raise ValueError(f"rows contain duplicates: {row_list}")
    return row_list
