"""The compile service: background compiles returning futures, in-flight deduplication,
byte-bounded memory cache, optional on-disk cache, failure cache, real time limits and the
``auto`` engine fallback."""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import sys
import threading
import time
import weakref
from collections.abc import Callable
from concurrent.futures import Future, InvalidStateError, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass
from typing import Any

import numpy as np

from .cache import ByteLRUCache, DiskCache, FailureCache, GrammarCache
from .cache_setup import open_cache, shared_failure_error
from .deadlines import DeadlineWatch
from .engines import (
    ENGINES,
    EmptyLanguage,
    Engine,
    UnsupportedSpec,
    compile_checked,
    create_engine,
    engine_class,
)
from .errors import (
    CompileWorkerLost,
    GrammarCompileError,
    GrammarEmptyLanguage,
    GrammarTimeout,
    RuntimeClosed,
)
from .local_lane import LocalLane
from .metrics import Metrics
from .specs import GrammarSpec
from .tokenizer_info import TokenizerInfo
from .worker import WorkerPool, WorkerReply

__all__ = ["RUNTIME_CACHE_VERSION", "CompileService", "CompiledGrammar"]

log = logging.getLogger(__name__)

#: Part of the disk cache key: bumped whenever a spec may compile to another grammar (CHANGELOG.md).
RUNTIME_CACHE_VERSION = "18"

#: Default ``local_below_s``: below this compile time the parent recompiles instead of
#: receiving the worker's serialized grammar. Kept at 0.1 s by measurement (xgrammar 0.2.8,
#: MaskBench, bench/bench_compile.py): serializing + deserializing cost a median 0.7x the
#: compile above ~25 ms but up to 35x at the tail (a 150 ms compile took 5.6 s to ship),
#: while a recompile costs what the worker just proved it costs.
LOCAL_BELOW_S = 0.1
#: Raced compiles that may wait for a slot in this process at once (more queue for a thread).
_RACE_WAITERS = 32
#: With ``race=True``, how long a compile in this process may hold its slot before waiting
#: compiles stop waiting for it and go to the workers (``LocalLane``). Strict JSON schemas of
#: real-world collections compile in tens of milliseconds (Github_hard p50 12 ms, xgrammar).
LOCAL_PATIENCE_S = 0.25
#: With ``race=True``, long compiles (past ``LOCAL_PATIENCE_S``) that may run here beside the
#: others; more go to the workers, where a compile that long runs twice or is shipped back
#: serialized. Bursts of 16 Github_hard schemas, ready p50/p90/max: 157 ms / 1.4 s / 5.7 s
#: with 4, 173 ms / 6.9 s / 9.9 s with 2; 209 ms / 3.5 s / 3.5 s for xgrammar one after the
#: other (bench/bench_compile_burst.py).
LOCAL_LONG_SLOTS = 4
#: With ``race=True``, specs longer than this (characters of canonical text) always compile in
#: a worker: building and parsing a grammar that large is Python and parsing that hold the
#: GIL here (a 100,000-string choice held it for seconds); real-world JSON schemas are far
#: smaller (Github_hard: all under 8,000).
LOCAL_MAX_CHARS = 64_000

#: Without a compile time limit, how long a miss waits for another process compiling the same
#: key before compiling it here too (a held lock must never mean waiting forever).
LOCK_WAIT_WITHOUT_LIMIT_S = 120.0

#: With a limit, a miss waits for another process's compile of the same key for at most this
#: share of the time its deadline leaves (then it compiles here with the rest).
LOCK_WAIT_SHARE = 0.5

#: With ``upgrade=True`` under ``auto``, a JSON schema another engine compiled is compiled
#: with this one in the background from its submission on: its masks are the fastest
#: (per-mask p99 on 419 MaskBench/Github schemas: llguidance 1.4 ms, xgrammar 93 us;
#: bench/results/engine_choice_cpu.json), and later requests use it.
UPGRADE_ENGINE = "xgrammar"
#: The longest an upgrade's compile may take (in a worker, killed past it): a spec whose
#: compile takes longer keeps its grammar. xgrammar compiles JSON Schema's open objects in
#: seconds (about 8 ms per state of the names a free property name must not spell, DeepSeek
#: vocabulary): at 1 s, 1,405 of 7,646 MaskBench schemas kept llguidance's slower masks.
#: Both compiles of an upgrade (the worker's, and this process's) run at a lowered priority.
UPGRADE_LIMIT_S = 5.0

#: The niceness of the thread that compiles an upgrade's grammar in this process (the
#: worker's compile runs at the long lane's, the same).
UPGRADE_NICE = 10

#: An upgrade's grammar is compiled once, in this process (GIL released, every core): a
#: worker runs the checks only (``prepare``), in milliseconds. A compile here cannot be
#: killed, so one past :data:`UPGRADE_LIMIT_S` fails the upgrade and is left to finish,
#: and while it runs the next upgrades compile in a worker first (killed past the limit),
#: then here again. False: always that way, as before (twice the compile time: Glaive's
#: open objects, 0.5-1 s, landed after twice that).
UPGRADE_COMPILES_HERE = True

#: The niceness of the thread that warms the upgrade engine's shared token masks at start
#: (``prewarm=True``): the lowest, so that it takes only the CPU nothing else wants.
PREWARM_NICE = 19

#: At interpreter exit, how long to wait for each prewarm to finish the schema it is
#: compiling (a thread left inside xgrammar's compile while the interpreter finalizes can
#: abort the process; the largest schema compiles in about 2.3 s).
PREWARM_EXIT_WAIT_S = 30.0

#: Running prewarm threads and their stop events (stopped and waited for at exit).
_PREWARMS: dict[threading.Thread, threading.Event] = {}


def _stop_prewarms() -> None:
    running = list(_PREWARMS.items())
    for _, stop in running:
        stop.set()
    for thread, _ in running:
        thread.join(timeout=PREWARM_EXIT_WAIT_S)


atexit.register(_stop_prewarms)

#: The most tokens a grammar's first mask may allow for the masks after each of them to be
#: computed with the compile (``CompiledGrammar.second_masks``): a JSON object's start
#: allows 4 with DeepSeek's vocabulary, a number's over a thousand.
SECOND_MASKS_MAX = 8

#: Upgrade outcomes remembered, so that each spec is tried once (the oldest forgotten).
_UPGRADES_KEPT = 4096

#: Upgrades waiting or running at most; past it a new schema is not queued (a later request
#: of it tries again), so a stream of new schemas cannot grow the queue without bound.
UPGRADES_QUEUED_MAX = 32


@dataclass(eq=False)  # (identity: two compiles of one spec are two grammars)
class CompiledGrammar:
    """A compiled grammar and the engine that made it."""

    engine: Engine
    grammar: Any
    nbytes: int
    #: "compile", "local" (compiled in this process: no time limit, or a fast compile
    #: redone here), "race" (this process's compile won a race with the worker), "disk",
    #: "memory" or "upgrade" (``CompileService(upgrade=True)``).
    source: str
    compile_s: float
    #: Set once an engine upgrade of the same spec compiled: the grammar later requests
    #: get, to which a request running on this one moves at its next mask
    #: (``Request``, "hand-over").
    upgraded: CompiledGrammar | None = None
    #: The mask of the grammar's start state (int32 words, read-only): every request's
    #: first mask, and a request's mask again once it rolled back to the start. Computed
    #: with the compile, in the thread that compiled (off the decode loop: a serving engine
    #: runs the prefill meanwhile), so a request's first fill is a copy; None where the
    #: engine failed on it or it allows no token (the request's own fill reports that).
    first_mask: np.ndarray | None = None
    #: The mask after each token the first mask allows, where it allows at most
    #: :data:`SECOND_MASKS_MAX` (an object's ``{``, ``{"``, ``{\n``, ``{\n\n``), computed
    #: with the first: a request's second fill is a copy too. At the second mask a new
    #: schema's first request still runs on ``auto``'s first engine (llguidance: 200-400 us
    #: a mask here when the caches are cold) while xgrammar's upgrade compiles.
    second_masks: dict[int, np.ndarray] | None = None
    #: The requests on this grammar that may move to its engine upgrade while it compiles
    #: (None: no upgrade is expected). When the upgrade lands, its thread moves them
    #: (:meth:`move_riders`), so that no decode step pays for a move.
    riders: weakref.WeakSet[Any] | None = None

    @property
    def engine_name(self) -> str:
        """Name of the engine (``xgrammar`` or ``llguidance``)."""
        return self.engine.name

    def compute_start_masks(self, words: int) -> None:
        """Fill :attr:`first_mask` and :attr:`second_masks` (rows of ``words`` int32 words)
        with a new matcher; also counted in :attr:`nbytes` (set before the grammar is
        cached)."""
        rows = np.zeros((2, words), dtype=np.int32)
        try:
            matcher = self.engine.new_matcher(self.grammar)
            matcher.fill(rows, 0)
            if matcher.error() is not None or not rows[0].any():
                return
            self.first_mask = self._kept(rows[0])
            seconds: dict[int, np.ndarray] = {}
            for token in _allowed_ids(rows[0], SECOND_MASKS_MAX) or ():
                if not matcher.accept(token):
                    continue
                if not matcher.is_terminated():  # (a stop token: nothing follows)
                    matcher.fill(rows, 1)
                    if matcher.error() is not None:
                        return
                    if rows[1].any():  # (a dead end: the request's own fill reports it)
                        seconds[token] = self._kept(rows[1])
                matcher.rollback(1)
        except Exception:  # the request's own fill meets it and reports it
            log.debug("start masks of a %s grammar failed", self.engine_name, exc_info=True)
            return
        self.second_masks = seconds or None

    def add_rider(self, request: Any) -> None:
        """Register ``request`` (a ``Request`` just installed on this grammar) to be moved
        when the upgrade lands; nothing where none is expected or it has landed."""
        with _RIDERS_LOCK:
            if self.riders is not None:
                self.riders.add(request)

    def move_riders(self) -> None:
        """Move every registered request to :attr:`upgraded` (``Request.hand_over``; set
        before this call: a request installed meanwhile moves at its next mask)."""
        with _RIDERS_LOCK:
            requests, self.riders = list(self.riders or ()), None
        for request in requests:
            try:
                request.hand_over()
            except Exception:  # one request's bug leaves it where it is
                log.exception("moving a request to the %s upgrade failed", self.engine_name)

    def _kept(self, row: np.ndarray) -> np.ndarray:
        """A read-only copy of ``row``, counted in :attr:`nbytes`."""
        mask = row.copy()
        mask.flags.writeable = False
        self.nbytes += mask.nbytes
        return mask


#: Guards every ``CompiledGrammar.riders`` (a request registering, the upgrade taking them).
_RIDERS_LOCK = threading.Lock()


def _allowed_ids(row: np.ndarray, most: int) -> list[int] | None:
    """The token ids ``row`` allows, or None where it allows more than ``most``."""
    words = np.flatnonzero(row)
    if len(words) > most:
        return None
    ids = [int(w) * 32 + bit for w in words for bit in range(32) if (int(row[w]) >> bit) & 1]
    return ids if len(ids) <= most else None


class CompileService:
    """Compiles specs in the background for one tokenizer.

    With ``timeout_s`` set, every compile runs in a worker process that is killed at the
    deadline, and the deadline counts from :meth:`submit`: the wait for a free worker and
    every engine ``auto`` tries share one limit (a later engine gets what the earlier ones
    left; none is tried once it ran out); with ``timeout_s=None`` compiles run in threads
    of this process. A worker that dies is an infrastructure fault: it is
    replaced and the compile retried once, and its failure is never cached. After
    :meth:`close`, pending compiles fail with :class:`RuntimeClosed` and :meth:`submit`
    refuses new ones.

    ``race=True`` (latency first): compiles run in this process, as the serving engines'
    own do, at most ``workers`` at once, smallest spec first (``LocalLane``); a grammar is
    then never shipped or compiled twice, so a miss costs one compile instead of the
    worker's round trip plus a recompile or a deserialization. What does not fit goes to
    the workers as without racing: a compile that waited while every slot was held by a
    compile running ``local_patience_s`` or more. The time limit still holds for the
    request: at the deadline it fails with :class:`GrammarTimeout`. What this gives up: a
    compile in this process cannot be killed, so one past its deadline keeps running in its
    thread (CPU and memory) until it ends; while it runs, every compile goes to the workers
    (``runaway``). An engine crash inside such a compile would take this process down. Off by
    default (the vLLM and SGLang backends turn it on: docs/latency.md).

    ``upgrade=True`` (with ``engine="auto"`` and a time limit): a JSON schema that ``auto``
    compiles with an engine other than :data:`UPGRADE_ENGINE` is compiled with that one in
    the background from its submission on (side by side with ``auto``'s first compile; one
    that finishes first is attached when that compile is delivered), one upgrade at a time
    (at most :data:`UPGRADES_QUEUED_MAX` queued), in a worker at the long lane's priority that
    starts only while no other compile waits, within :data:`UPGRADE_LIMIT_S`. Once it
    compiled, later requests get it and requests already running move to it at their next
    mask (``CompiledGrammar.upgraded``; both engines accept the same language:
    docs/json_schema.md), except with ``any_whitespace=False`` (each engine lays out
    compact JSON its own way). A spec the engine refuses, or that compiles too slowly, keeps
    its grammar. :meth:`upgrade_state` says how a spec's upgrade went.

    ``prewarm=True`` (with the upgrades on): at start, a background thread at nice
    :data:`PREWARM_NICE` compiles small schemas whose rules recur in real-world schemas
    (length bounds, formats, open objects' names) with the upgrade engine, so that their
    token masks are in its compiler cache before a new schema's upgrade needs them
    (``engines.xgrammar_prewarm``); :attr:`prewarm_done` is set when it ends (done, or
    stopped by :meth:`close` once the schema it was compiling is).
    """

    def __init__(
        self,
        info: TokenizerInfo,
        *,
        engine: str,
        auto_order: tuple[str, ...] = ("llguidance", "xgrammar"),
        timeout_s: float | None = 30.0,
        workers: int = 1,
        fill_threads: int = 1,
        cache_bytes: int = 512 << 20,
        disk_cache_dir: str | GrammarCache | None = None,
        failure_ttl_s: float = 30.0,
        local_below_s: float = LOCAL_BELOW_S,
        metrics: Metrics | None = None,
        race: bool = False,
        local_patience_s: float = LOCAL_PATIENCE_S,
        upgrade: bool = False,
        prewarm: bool = False,
    ) -> None:
        if engine != "auto" and engine not in ENGINES:
            raise ValueError(f"unknown engine {engine!r}; choose from {['auto', *ENGINES]}")
        if timeout_s is not None and timeout_s <= 0:
            raise ValueError(f"compile timeout must be > 0 seconds or None, got {timeout_s}")
        bad = [e for e in auto_order if e not in ENGINES]
        if bad or not auto_order:
            raise ValueError(f"auto_order must name engines from {sorted(ENGINES)}, got {auto_order}")
        self.info = info
        self.engine_choice = engine
        self.order = tuple(auto_order) if engine == "auto" else (engine,)
        self.timeout_s = timeout_s
        self.metrics = metrics or Metrics()
        self._fill_threads = fill_threads
        self._memory: ByteLRUCache[CompiledGrammar] = ByteLRUCache(cache_bytes)
        self._failures = FailureCache(failure_ttl_s)
        self._disk: GrammarCache | None = (
            disk_cache_dir if isinstance(disk_cache_dir, GrammarCache)
            else open_cache(disk_cache_dir) if disk_cache_dir else None)
        if self._disk is not None:
            self._disk.attach_metrics(self.metrics)
        self._engines: dict[str, Engine] = {}
        self._engine_lock = threading.Lock()
        self._inflight: dict[str, Future[CompiledGrammar]] = {}
        self._inflight_lock = threading.Lock()
        # Raced compiles wait in these threads for a slot in this process (LocalLane: a
        # burst goes smallest first); other compiles only hand jobs over.
        self._threads = ThreadPoolExecutor(_RACE_WAITERS if race else max(2, workers + 1),
                                           thread_name_prefix="pg-compile")
        self._closed = False
        self._race = bool(race)
        self._lane = LocalLane(workers, local_patience_s, long_slots=LOCAL_LONG_SLOTS)
        self._deadlines = DeadlineWatch()
        #: A compile in this process still running past its deadline; every compile goes to
        #: the workers until it ends.
        self.runaway: Future[Any] | None = None
        self._upgrade = (upgrade and engine == "auto" and timeout_s is not None
                         and UPGRADE_ENGINE in self.order[1:])
        #: Spec key -> "running", "done", "failed" or "dropped" (:meth:`upgrade_state`).
        self._upgrades: dict[str, str] = {}
        #: Upgrades that compiled before their spec's first compile was delivered: attached
        #: to that grammar when it is (:meth:`_settle`).
        self._early_upgrades: dict[str, CompiledGrammar] = {}
        self._upgrades_queued = 0
        # The upgrade's compile in this process runs at a lowered priority too: at normal
        # priority it took the CPU from the masks of the requests that started it.
        self._upgrader = ThreadPoolExecutor(1, thread_name_prefix="pg-upgrade",
                                            initializer=_lower_thread_priority)
        # The upgrade's compile here (UPGRADE_COMPILES_HERE), in its own thread so that
        # the upgrade can give up on it at its limit; one past the limit is kept here
        # until it ends.
        self._upgrade_compiler = ThreadPoolExecutor(1, thread_name_prefix="pg-upgrade-compile",
                                                    initializer=_lower_thread_priority)
        self._upgrade_runaway: Future[Any] | None = None
        self._pool: WorkerPool | None = None
        if timeout_s is not None:
            self._pool = WorkerPool(
                self._worker_engines, size=workers, local_below_s=local_below_s,
                on_kill=lambda: self.metrics.inc("workers_killed"),
            )
            # This process's engines finish the worker compiles (and an upgrade's): built
            # while the workers start, not at the first reply. (A tokenizer conversion can
            # hold the GIL for 100-200 ms: not while serving.)
            for name in self.order:
                self._threads.submit(self._warm_engine, name)
        #: Set when the background prewarm ended (finished, or stopped by :meth:`close`);
        #: set at once without one.
        self.prewarm_done = threading.Event()
        self._prewarm_stop = threading.Event()
        self._prewarm_thread: threading.Thread | None = None
        if self._upgrade and prewarm:
            self._prewarm_thread = threading.Thread(target=self._prewarm, name="pg-prewarm",
                                                    daemon=True)
            _PREWARMS[self._prewarm_thread] = self._prewarm_stop
            self._prewarm_thread.start()
        else:
            self.prewarm_done.set()

    # -- engines ---------------------------------------------------------------------------
    def engine(self, name: str) -> Engine:
        """This process's engine ``name`` (created on first use)."""
        eng = self._engines.get(name)
        if eng is None:
            with self._engine_lock:
                eng = self._engines.get(name)
                if eng is None:
                    eng = self._engines[name] = create_engine(
                        name, self.info, fill_threads=self._fill_threads)
        return eng

    def warm(self) -> None:
        """Build this process's engines now (see :meth:`GrammarRuntime.warm`)."""
        for name in self.order:
            self.engine(name)

    def _prewarm(self) -> None:
        _lower_thread_priority(PREWARM_NICE)
        try:
            from .engines.xgrammar_prewarm import prewarm

            compiled, failed = prewarm(self.engine(UPGRADE_ENGINE), self._prewarm_stop)
            self.metrics.inc("prewarm_compiled", compiled)
            self.metrics.inc("prewarm_failed", failed)
        except Exception as exc:  # noqa: BLE001 - a warm-up never fails the runtime
            log.info("the %s prewarm stopped: %s", UPGRADE_ENGINE, exc)
        finally:
            _PREWARMS.pop(threading.current_thread(), None)
            self.prewarm_done.set()

    def _warm_engine(self, name: str) -> None:
        try:
            self.engine(name)
        except Exception as exc:  # noqa: BLE001 - the first compile builds it and reports why
            log.info("engine %s not built ahead of the first compile: %s", name, exc)

    def _worker_engines(self) -> dict[str, Any]:
        return {name: engine_class(name).tokenizer_payload(self.info) for name in self.order}

    def cache_usage(self) -> tuple[int, int]:
        """``(bytes, entries)`` held by the in-memory cache of compiled grammars."""
        return self._memory.nbytes, len(self._memory)

    def worker_pids(self, *, busy: bool = False) -> list[int]:
        """Process ids of the live compile workers (empty without a time limit; ``busy``:
        only those running a compile, the oldest compile first)."""
        if self._pool is None:
            return []
        return self._pool.busy_pids() if busy else self._pool.pids()

    @property
    def closed(self) -> bool:
        """True once :meth:`close` was called."""
        return self._closed

    def close(self) -> None:
        """Stop the workers and the compile threads; every pending compile fails at once
        with :class:`RuntimeClosed`, and later submits are refused."""
        self._closed = True
        self._prewarm_stop.set()
        with self._inflight_lock:
            pending = list(self._inflight.values())
            self._inflight.clear()
        error = RuntimeClosed("the grammar runtime was closed before this compile finished")
        for fut in pending:
            _resolve(fut, error)
        self._threads.shutdown(wait=False, cancel_futures=True)
        self._upgrader.shutdown(wait=False, cancel_futures=True)
        self._upgrade_compiler.shutdown(wait=False, cancel_futures=True)
        if self._pool is not None:
            self._pool.close()

    def discard(self, compiled: CompiledGrammar) -> bool:
        """Drop ``compiled`` from the memory cache (an engine failed on it mid-request, which
        may have left state shared by its matchers broken), and from the engine library's
        own cache; returns whether it was in the memory cache."""
        compiled.engine.forget(compiled.grammar)
        return self._memory.remove_value(compiled)

    # -- submitting ------------------------------------------------------------------------
    def submit(self, spec: GrammarSpec) -> Future[CompiledGrammar]:
        """A future of the compiled ``spec``; never blocks on a compile."""
        if not isinstance(spec, GrammarSpec):
            raise TypeError(f"spec must be a GrammarSpec, got {type(spec).__name__}")
        if self._closed:
            raise RuntimeClosed("the grammar runtime is closed: it takes no new compiles")
        key = f"{self.engine_choice}:{spec.key}"
        hit = self._memory.get(key)
        if hit is not None:
            self.metrics.inc("cache_hits_memory")
            if self._upgrade and hit.engine_name != UPGRADE_ENGINE:
                self._start_upgrade(key, spec)
            fut: Future[CompiledGrammar] = Future()
            fut.set_result(hit)
            return fut
        error = self._failures.get(key)
        if error is not None:
            self.metrics.inc("cache_hits_failure")
            fut = Future()
            fut.set_exception(error)
            return fut
        with self._inflight_lock:
            pending = self._inflight.get(key)
            if pending is not None:
                self.metrics.inc("inflight_dedup")
                return pending
            fut = self._inflight[key] = Future()
            fut.set_running_or_notify_cancel()
        self.metrics.inc("cache_misses")
        # One deadline per submission, for every engine `auto` tries and every wait.
        deadline = None if self.timeout_s is None else time.monotonic() + self.timeout_s
        try:
            if self._pool is not None and self._disk is None and not self._race:
                # The common path: no thread of ours waits; the worker pool's reader
                # finishes the compile (_Attempt).
                _Attempt(self, key, spec, fut, deadline).start()
            else:
                self._threads.submit(self._run, key, spec, fut, deadline)
        except (RuntimeError, RuntimeClosed):  # closed between the check above and here
            with self._inflight_lock:
                self._inflight.pop(key, None)
            raise RuntimeClosed("the grammar runtime is closed: it takes no new compiles") \
                from None
        if self._upgrade:  # (auto's first engine is another)
            # Side by side with the first compile (after it, in the pool's queue): the
            # upgrade then lands about one compile sooner, often before the second mask.
            self._start_upgrade(key, spec)
        return fut

    # -- upgrades --------------------------------------------------------------------------
    def upgrade_state(self, spec: GrammarSpec) -> str | None:
        """How ``spec``'s engine upgrade went (``upgrade=True``): ``"running"``, ``"done"``
        (later requests get :data:`UPGRADE_ENGINE`'s grammar), ``"failed"`` (refused, or
        its compile ran past :data:`UPGRADE_LIMIT_S`: it keeps its grammar), ``"dropped"``
        (its grammar left the cache meanwhile), or None (not tried, or it never found a
        free worker within the limit: the next request tries again)."""
        with self._inflight_lock:
            return self._upgrades.get(f"{self.engine_choice}:{spec.key}")

    def _start_upgrade(self, key: str, spec: GrammarSpec) -> None:
        if spec.kind != "json_schema":  # (one language on every engine: JSON Schema's)
            return
        with self._inflight_lock:
            if (key in self._upgrades or self._closed
                    or self._upgrades_queued >= UPGRADES_QUEUED_MAX):
                return
            self._upgrades[key] = "running"
            self._upgrades_queued += 1
            if len(self._upgrades) > _UPGRADES_KEPT:
                del self._upgrades[next(iter(self._upgrades))]
        try:
            self._upgrader.submit(self._run_upgrade, key, spec)
        except RuntimeError:  # closed meanwhile
            self._end_upgrade(key, "dropped")

    def _run_upgrade(self, key: str, spec: GrammarSpec) -> None:
        try:
            engine = self.engine(UPGRADE_ENGINE)
            if self._pool is None:  # (upgrade=True needs a limit: see __init__)
                raise RuntimeError("no compile workers")
            runaway = self._upgrade_runaway
            here = UPGRADE_COMPILES_HERE and (runaway is None or runaway.done())
            status, text, _ = self._pool.run(UPGRADE_ENGINE, spec.to_dict(), UPGRADE_LIMIT_S,
                                             serialize="prepare" if here else "prepared",
                                             background=True)
            _raise_for_status(status, text, UPGRADE_ENGINE)
            t0 = time.perf_counter()
            grammar = (self._compile_upgrade(engine, spec, text) if here
                       else _recompile(engine, spec, text))
            compiled = CompiledGrammar(engine, grammar, engine.nbytes(grammar), "upgrade",
                                       time.perf_counter() - t0)
            compiled.compute_start_masks(self.info.bitmask_words)
        except GrammarTimeout as exc:
            if exc.started:
                self._upgrade_failed(key, spec, exc)
            else:  # other compiles kept every worker busy: a later request tries again
                self._end_upgrade(key, None)
            return
        except Exception as exc:  # noqa: BLE001 - the spec keeps the grammar it has
            self._upgrade_failed(key, spec, exc)
            return
        with self._inflight_lock:
            old = None if self._closed else self._memory.get(key)
            if old is None and not self._closed and key in self._inflight:
                # The first compile is still running: _settle attaches this one.
                self._early_upgrades[key] = compiled
                return
            kept = old is not None
            if old is not None:
                self._attach_upgrade(key, spec, old, compiled)
        try:
            if old is not None:
                old.move_riders()  # (in this thread, off the decode loop; before "done")
        finally:
            self.metrics.inc("upgrades" if kept else "upgrades_dropped")
            self._end_upgrade(key, "done" if kept else "dropped")

    def _attach_upgrade(self, key: str, spec: GrammarSpec, old: CompiledGrammar,
                        compiled: CompiledGrammar) -> None:
        """Later requests of ``key`` get ``compiled``; requests on ``old`` move to it at
        their next mask. Caller holds ``_inflight_lock``."""
        self._memory.put(key, compiled, compiled.nbytes)
        if spec.option("any_whitespace", True):
            # Running requests move over; not where each engine has its own layout (no
            # free whitespace): a text would mix the two.
            old.upgraded = compiled

    def _compile_upgrade(self, engine: Engine, spec: GrammarSpec, text: Any) -> Any:
        """The upgrade's only compile, of what a worker checked (``text``), within
        :data:`UPGRADE_LIMIT_S`; past it :class:`GrammarTimeout`, the compile left running
        as :attr:`_upgrade_runaway`."""
        job = self._upgrade_compiler.submit(_recompile_checked, engine, spec, text)
        try:
            return job.result(timeout=UPGRADE_LIMIT_S)
        except FutureTimeout:
            self._upgrade_runaway = job
            raise GrammarTimeout(f"the {UPGRADE_ENGINE} compile ran past {UPGRADE_LIMIT_S} s",
                                 engine=UPGRADE_ENGINE) from None

    def _upgrade_failed(self, key: str, spec: GrammarSpec, exc: BaseException) -> None:
        log.info("%r keeps its grammar (no %s upgrade): %s", spec, UPGRADE_ENGINE, exc)
        self.metrics.inc("upgrade_failures")
        self._end_upgrade(key, "failed")

    def _end_upgrade(self, key: str, state: str | None) -> None:
        """Record how ``key``'s upgrade ended (None: forget it, so it is tried again)."""
        with self._inflight_lock:
            self._upgrades_queued -= 1
            if key in self._upgrades:
                if state is None:
                    del self._upgrades[key]
                else:
                    self._upgrades[key] = state

    def _run(self, key: str, spec: GrammarSpec, fut: Future[CompiledGrammar],
             deadline: float | None = None) -> None:
        errors: list[GrammarCompileError] = []
        result: CompiledGrammar | None = None
        for i, name in enumerate(self.order):
            if i:
                self.metrics.inc("engine_fallbacks")
                log.info("%r: falling back to engine %s", spec, name)
            if self._closed:
                return  # close() resolved the future
            try:
                result = self._compile_one(
                    name, spec, deadline,
                    expire=lambda exc: self._settle(key, spec, fut, None, [exc]))
                break
            except RuntimeClosed:
                return
            except GrammarCompileError as exc:
                errors.append(exc)
            except Exception as exc:  # noqa: BLE001 - an engine bug fails this spec, not the service
                errors.append(GrammarCompileError(f"{type(exc).__name__}: {exc}", engine=name))
            (log.warning if isinstance(errors[-1], GrammarTimeout) else log.info)(
                "%r did not compile: %s", spec, errors[-1])
        self._settle(key, spec, fut, result, errors)

    def _settle(self, key: str, spec: GrammarSpec, fut: Future[CompiledGrammar],
                result: CompiledGrammar | None, errors: list[GrammarCompileError]) -> None:
        """Cache and deliver the outcome of a compile (every engine tried); start its
        engine upgrade."""
        if result is not None and result.first_mask is None:
            result.compute_start_masks(self.info.bitmask_words)
        with self._inflight_lock:
            if self._inflight.get(key) is fut:
                del self._inflight[key]
            early = self._early_upgrades.pop(key, None)
            upgradable = (result is not None and self._upgrade and spec.kind == "json_schema"
                          and result.engine_name != UPGRADE_ENGINE)
            attached = early is not None and upgradable
            if result is not None:
                if upgradable and not attached:
                    # Before it is cached: an upgrade landing from then on moves them.
                    result.riders = weakref.WeakSet()
                self._memory.put(key, result, result.nbytes)
                if early is not None and attached:
                    # The upgrade compiled first: requests made with this grammar move to
                    # it at their second mask, later ones get it.
                    self._attach_upgrade(key, spec, result, early)
            else:
                error = _combine(errors)
                # A dead worker says nothing about the grammar: the next request retries.
                if not any(isinstance(e, CompileWorkerLost) for e in errors):
                    self._failures.put(key, error)
        if early is not None:
            self.metrics.inc("upgrades" if attached else "upgrades_dropped")
            self._end_upgrade(key, "done" if attached else "dropped")
        if result is not None:
            # Queued before the caller wakes, so that upgrade_state already says "running".
            if upgradable:
                self._start_upgrade(key, spec)
            _resolve(fut, result)
        else:
            self.metrics.inc("compile_timeouts" if isinstance(error, GrammarTimeout)
                             else "compile_errors")
            _resolve(fut, error)

    def _compile_one(self, name: str, spec: GrammarSpec, deadline: float | None = None,
                     expire: Callable[[GrammarCompileError], None] | None = None,
                     ) -> CompiledGrammar:
        """Compile ``spec`` with engine ``name`` (disk cache, single flight) by ``deadline``;
        ``expire`` fails the request at once when a compile in this thread runs past it."""
        built = time.monotonic()
        engine = self.engine(name)
        if deadline is not None:
            # Building this process's engine (once, at start) is not the grammar's time.
            deadline += time.monotonic() - built
        if deadline is not None and time.monotonic() >= deadline:
            raise GrammarTimeout(f"the time limit of {self.timeout_s:g} s (counted from "
                                 f"submission) ran out before engine {name} could start",
                                 engine=name, started=False)
        if self._disk is None:
            return self._compile_new(engine, name, spec, None, deadline, expire)
        disk_key = DiskCache.make_key(
            engine=name, engine_version=engine.version(), runtime=RUNTIME_CACHE_VERSION,
            tokenizer=self.info.fingerprint, spec=spec.key,
        )
        hit = self._from_disk(engine, disk_key)
        if hit is not None:
            return hit
        self._raise_shared_failure(name, disk_key)
        # A miss: one compile across the processes sharing the cache; the others wait
        # and then load its entry, or compile here when it left none (its compile failed,
        # or it is still compiling: a compile here then has what the deadline leaves).
        # With a limit, at most half of what is left goes to waiting: a holder that is stuck
        # or slower than this limit leaves the other half for a compile here.
        wait_s = ((deadline - time.monotonic()) * LOCK_WAIT_SHARE if deadline is not None
                  else LOCK_WAIT_WITHOUT_LIMIT_S)
        with self._disk.single_flight(disk_key, wait_s):
            hit = self._from_disk(engine, disk_key)
            if hit is not None:
                return hit
            self._raise_shared_failure(name, disk_key)
            try:
                return self._compile_new(engine, name, spec, disk_key, deadline, expire)
            except GrammarCompileError as exc:
                # Recorded before the lock is released: its waiters fail at once (a shared
                # cache; the local directory records none). A dead worker, or a limit spent
                # in this process's queue, says nothing of the grammar to other processes.
                if not (isinstance(exc, CompileWorkerLost)
                        or (isinstance(exc, GrammarTimeout) and not exc.started)):
                    self._disk.put_failure(disk_key, type(exc).__name__, str(exc),
                                           self._failures.ttl_s)
                raise

    def _raise_shared_failure(self, name: str, disk_key: str) -> None:
        """Raise the failure another process recorded for ``disk_key``, if any."""
        assert self._disk is not None
        record = self._disk.failure(disk_key)
        if record is not None:
            self.metrics.inc("cache_hits_shared_failure")
            raise shared_failure_error(*record, engine=name)

    def _from_disk(self, engine: Engine, disk_key: str) -> CompiledGrammar | None:
        assert self._disk is not None
        text = self._disk.get(disk_key)
        if text is None:
            return None
        try:
            grammar = engine.deserialize(text)
        except Exception as exc:  # noqa: BLE001 - a stale or broken entry: compile, overwrite
            log.warning("disk cache entry %s could not be loaded by %s %s (%s: %s); "
                        "compiling it again", disk_key[:16], engine.name, engine.version(),
                        type(exc).__name__, str(exc)[:200])
            self._disk.remove(disk_key)
            return None
        self.metrics.inc("cache_hits_disk")
        return CompiledGrammar(engine, grammar, engine.nbytes(grammar), "disk", 0.0)

    def _compile_new(self, engine: Engine, name: str, spec: GrammarSpec,
                     disk_key: str | None, deadline: float | None = None,
                     expire: Callable[[GrammarCompileError], None] | None = None,
                     ) -> CompiledGrammar:
        """Compile a miss (``deadline``: when the worker's compile must be done, monotonic;
        default the service's limit from now)."""
        t0 = time.perf_counter()
        if self._pool is None:
            grammar = _compile_here(engine, name, spec)
            return self._compiled(engine, grammar, "local", time.perf_counter() - t0, None,
                                  disk_key)
        if self._race and self.runaway is None:
            grammar = self._compile_raced(engine, name, spec, deadline, expire)
            if grammar is not None:
                return self._compiled(engine, grammar, "race", time.perf_counter() - t0,
                                      None, disk_key)
        assert self.timeout_s is not None
        # "auto" with a disk cache too: a fast compile is redone here and serialized here
        # for the disk, outside the limit; serializing in the worker counted against it (a
        # 25 ms compile whose 83 MB took 3.3 s to serialize timed out).
        status, text, worker_s = self._pool.run(
            name, spec.to_dict(), self.timeout_s, serialize="auto", deadline=deadline)
        t_reply = time.perf_counter()
        _raise_for_status(status, text, name)
        return self._finish_worker_compile(engine, spec, text, t0, t_reply, worker_s, disk_key)

    def _finish_worker_compile(self, engine: Engine, spec: GrammarSpec, text: Any,
                               t0: float, t_reply: float, worker_s: float,
                               disk_key: str | None = None) -> CompiledGrammar:
        """This process's grammar for a compile a worker finished: recompiled (``text`` is
        None or what the engine's ``prepare`` returned: it compiled, and was checked, fast)
        or deserialized."""
        if text is None or isinstance(text, dict):
            grammar, source = _recompile(engine, spec, text), "local"
            text = None
        else:
            grammar, source = engine.deserialize(text), "compile"
        # Compile time excludes the wait for a free worker (reported separately).
        self.metrics.observe("compile_wait", t_reply - t0 - worker_s)
        return self._compiled(engine, grammar, source, time.perf_counter() - (t_reply - worker_s),
                              text, disk_key)

    def _compiled(self, engine: Engine, grammar: Any, source: str, seconds: float,
                  text: str | None, disk_key: str | None) -> CompiledGrammar:
        self.metrics.inc("compiles")
        self.metrics.observe("compile", seconds)
        if self._disk is not None and disk_key is not None:
            if text is None:
                text = engine.serialize(grammar)
            self._disk.put(disk_key, text)
        return CompiledGrammar(engine, grammar, engine.nbytes(grammar), source, seconds)

    def _compile_raced(self, engine: Engine, name: str, spec: GrammarSpec,
                       deadline: float | None = None,
                       expire: Callable[[GrammarCompileError], None] | None = None,
                       ) -> Any | None:
        """Compile in this thread, the deadline kept (class doc): at the deadline ``expire``
        fails the request while the compile goes on here (a late grammar still fills the
        memory cache). None when no slot here came free in time (:class:`LocalLane`): the
        compile then goes to a worker."""
        slot = (self._lane.enter(len(spec.text), deadline)
                if len(spec.text) <= LOCAL_MAX_CHARS else None)
        if slot is None:
            self.metrics.inc("race_lane_full")
            return None
        ended: Future[None] = Future()  # the runaway's marker, done when the compile ends

        def past_deadline() -> None:
            if ended.done():
                return
            self.runaway = ended
            self.metrics.inc("race_runaways")
            log.warning("%r: compile still running in this process at its deadline; "
                        "compiles go to the workers until it ends", spec)
            ended.add_done_callback(self._runaway_ended)
            if expire is not None:
                expire(GrammarTimeout(f"did not compile within the time limit of "
                                      f"{self.timeout_s:g} s (counted from submission; "
                                      f"compiled in this process)", engine=name))

        watch = None if deadline is None else self._deadlines.add(deadline, past_deadline)
        try:
            grammar = _compile_here(engine, name, spec)
        finally:
            if watch is not None:
                self._deadlines.cancel(watch)
            ended.set_result(None)
            self._lane.leave(slot)
        if self.runaway is not ended:
            self.metrics.inc("races_won_here")
        return grammar

    def _runaway_ended(self, done: Future[Any]) -> None:
        if self.runaway is done:
            self.runaway = None
            log.info("the runaway raced compile ended; races resume")


#: A reply whose worker compile took less than this is finished (the grammar recompiled
#: here) in the pool's reader thread; slower ones, and deserializations, in a compile thread
#: (the reader also enforces the other compiles' deadlines).
_FINISH_IN_READER_BELOW_S = 0.02


class _Attempt:
    """One miss compiled through the worker pool without a waiting thread: each engine of
    the order in turn, each step run by the pool's reader as the reply comes (the path of
    :meth:`CompileService._run` when there is neither a disk cache nor racing)."""

    __slots__ = ("deadline", "errors", "fut", "index", "key", "service", "spec", "t0")

    def __init__(self, service: CompileService, key: str, spec: GrammarSpec,
                 fut: Future[CompiledGrammar], deadline: float | None) -> None:
        self.service, self.key, self.spec, self.fut = service, key, spec, fut
        self.deadline = deadline
        self.index = 0
        self.errors: list[GrammarCompileError] = []
        self.t0 = 0.0

    @property
    def name(self) -> str:
        return self.service.order[self.index]

    def start(self) -> None:
        """Hand the compile with the current engine to the pool (raises RuntimeClosed)."""
        service = self.service
        assert service._pool is not None and service.timeout_s is not None
        if self.index:
            service.metrics.inc("engine_fallbacks")
            log.info("%r: falling back to engine %s", self.spec, self.name)
        self.t0 = time.perf_counter()
        service._pool.submit(self.name, self.spec.to_dict(), service.timeout_s, "auto",
                             self._on_reply, deadline=self.deadline)

    def _on_reply(self, outcome: WorkerReply | BaseException) -> None:
        t_reply = time.perf_counter()
        if isinstance(outcome, RuntimeClosed):
            return  # close() resolved the future
        if isinstance(outcome, GrammarCompileError):
            self._failed(outcome)
            return
        if isinstance(outcome, BaseException):
            self._failed(GrammarCompileError(f"{type(outcome).__name__}: {outcome}",
                                             engine=self.name))
            return
        status, text, worker_s = outcome
        if status != "ok":
            try:
                _raise_for_status(status, text, self.name)
            except GrammarCompileError as exc:
                self._failed(exc)
            return
        engine = self.service._engines.get(self.name)
        # A recompile (no serialized grammar to load) of a fast compile: done right here.
        if (engine is not None and not isinstance(text, str)
                and worker_s < _FINISH_IN_READER_BELOW_S):
            self._finish(text, t_reply, worker_s)
            return
        try:
            self.service._threads.submit(self._finish, text, t_reply, worker_s)
        except RuntimeError:  # closed: close() resolved the future
            return

    def _finish(self, text: Any, t_reply: float, worker_s: float) -> None:
        service = self.service
        if service.closed:
            return
        try:
            result = service._finish_worker_compile(service.engine(self.name), self.spec,
                                                    text, self.t0, t_reply, worker_s)
        except GrammarCompileError as exc:
            self._failed(exc)
            return
        except Exception as exc:  # noqa: BLE001 - an engine bug fails this spec, not the service
            self._failed(GrammarCompileError(f"{type(exc).__name__}: {exc}", engine=self.name))
            return
        service._settle(self.key, self.spec, self.fut, result, self.errors)

    def _failed(self, error: GrammarCompileError) -> None:
        service = self.service
        self.errors.append(error)
        (log.warning if isinstance(error, GrammarTimeout) else log.info)(
            "%r did not compile: %s", self.spec, error)
        out_of_time = self.deadline is not None and time.monotonic() >= self.deadline
        if self.index + 1 < len(service.order) and not service.closed and not out_of_time:
            self.index += 1
            try:
                self.start()
                return
            except RuntimeClosed:
                return
        service._settle(self.key, self.spec, self.fut, None, self.errors)


def _lower_thread_priority(nice: int = UPGRADE_NICE) -> None:
    """Lower the calling thread's priority to ``nice`` (default: the long lane's; Linux,
    where a thread has its own nice value and threads it starts inherit it; elsewhere a
    no-op)."""
    if sys.platform.startswith("linux"):
        with contextlib.suppress(OSError):
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), nice)


def _recompile(engine: Engine, spec: GrammarSpec, text: Any) -> Any:
    """This process's grammar for a spec a worker compiled and did not ship (``text`` is
    None, or what the engine's ``prepare`` returned: the worker ran the lowering and the
    checks, only the engine's compile is left)."""
    if isinstance(text, dict) and hasattr(engine, "compile_prepared"):
        return engine.compile_prepared(tuple(text["prepared"]))
    return engine.compile(spec)


def _recompile_checked(engine: Engine, spec: GrammarSpec, text: Any) -> Any:
    """:func:`_recompile`, refusing an empty language (a worker that only prepared the
    spec could not check that)."""
    grammar = _recompile(engine, spec, text)
    engine.check_not_empty(grammar)
    return grammar


def _compile_here(engine: Engine, name: str, spec: GrammarSpec) -> Any:
    """Compile ``spec`` in this thread, errors as :class:`GrammarCompileError`."""
    try:
        return compile_checked(engine, spec)
    except UnsupportedSpec as exc:
        raise GrammarCompileError(f"unsupported spec: {exc}", engine=name) from exc
    except EmptyLanguage as exc:
        raise GrammarEmptyLanguage(str(exc), engine=name) from exc
    except Exception as exc:
        raise GrammarCompileError(f"{type(exc).__name__}: {exc}", engine=name) from exc


def _raise_for_status(status: str, text: Any, engine: str) -> None:
    """Raise the error a worker's reply reports (nothing for "ok")."""
    if status == "unsupported":
        raise GrammarCompileError(f"unsupported spec: {text}", engine=engine)
    if status == "empty":
        raise GrammarEmptyLanguage(str(text), engine=engine)
    if status != "ok":
        raise GrammarCompileError(str(text), engine=engine)


def _combine(errors: list[GrammarCompileError]) -> GrammarCompileError:
    """One error for a spec every engine failed: a time-out or an empty language only when
    every engine said so (one engine's refusal says nothing about the other's)."""
    if len(errors) == 1:
        return errors[0]
    detail = "; ".join(str(e) for e in errors)
    cls: type[GrammarCompileError] = GrammarCompileError
    for kind in (GrammarTimeout, GrammarEmptyLanguage):
        if all(isinstance(e, kind) for e in errors):
            cls = kind
    return cls(f"every engine failed: {detail}")


def _resolve(fut: Future[CompiledGrammar], outcome: CompiledGrammar | BaseException) -> None:
    """Set ``fut``'s outcome unless it already has one (``close`` fails pending futures
    while their compile threads may still finish)."""
    with contextlib.suppress(InvalidStateError):
        if isinstance(outcome, BaseException):
            fut.set_exception(outcome)
        else:
            fut.set_result(outcome)
