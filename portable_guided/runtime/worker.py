"""Compile worker processes: the time limit that really stops a compile.

A compile runs in a worker process; the parent waits for the reply until the deadline and
then kills the worker (SIGKILL), which frees its CPU and memory at once, and a spare worker
takes the next compile at once while a replacement starts. Workers are forked from a fork
server: a fresh interpreter that built the engines once (about 1.5-4 s), so a new worker
costs a fork (about 10-20 ms) instead of that start. The worker sends back the compiled grammar serialized, or,
when the compile took less than ``local_below_s`` (cheaper to redo than to serialize and
ship), only the news that the spec compiles fast, and the parent compiles it itself.
"""

from __future__ import annotations

import collections
import contextlib
import ctypes
import errno
import itertools
import logging
import math
import os
import pickle
import selectors
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from multiprocessing.connection import Connection
from typing import Any

from .errors import CompileWorkerLost, GrammarTimeout, RuntimeClosed

__all__ = ["WorkerPool", "WorkerReply"]

log = logging.getLogger(__name__)

#: (status, text, compile_seconds): status is "ok", "unsupported", "empty" or "error"; for
#: "ok", text is the serialized grammar, or None (recompile locally), or ``{"prepared": ...}``
#: (recompile locally from the engine's ``prepare`` output, checks already passed).
WorkerReply = tuple[str, Any, float]


def main() -> None:
    """Entry point of a worker process (``python .../runtime/_worker_entry.py RFD WFD``).

    The worker is a fresh interpreter (not a fork, so none of the parent's threads or
    locks come along, and not ``multiprocessing`` spawn, which would re-run the caller's
    main module); it talks to the parent over two pipes.
    """
    if sys.argv[1] == "--fork-server":
        _fork_server(int(sys.argv[2]))
        return
    rfd, wfd = int(sys.argv[1]), int(sys.argv[2])
    _die_with_parent()
    conn = _Duplex(Connection(rfd, writable=False), Connection(wfd, readable=False))
    payloads, local_below_s = conn.recv()
    _serve(conn, payloads, local_below_s)


def _fork_server(fd: int) -> None:
    """Build the engines once, then fork a worker per request (:class:`_ForkServer`).

    Forked while no compile runs, so no engine thread is caught mid-work (the engines'
    native threads are not copied into a fork; a compile in the child starts its own).
    Children are reaped by the kernel (``SIGCHLD`` ignored): the pool kills them by pid file
    descriptor, never waits for them as its own."""
    _die_with_parent()
    ctrl = socket.socket(fileno=fd)
    conn = Connection(os.dup(fd))
    payloads, local_below_s = conn.recv()
    engines = _build_engines(payloads)
    _warm(engines)
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)
    conn.send(("ready", os.getpid()))
    while True:
        try:
            request = conn.recv()
        except EOFError:
            return
        if request is None:
            return
        ours, theirs = socket.socketpair()
        pid = os.fork()
        if pid == 0:  # the worker
            try:
                signal.signal(signal.SIGCHLD, signal.SIG_DFL)
                ctrl.close()
                conn.close()
                ours.close()
                _die_with_parent()
                child = Connection(theirs.detach())
                child.send(("ready", os.getpid()))
                _serve_engines(child, engines, local_below_s)
            finally:
                os._exit(0)
        theirs.close()
        socket.send_fds(ctrl, [struct.pack("!i", pid)], [ours.fileno()])
        ours.close()


def _die_with_parent() -> None:
    """Exit as soon as the parent dies, even in the middle of a compile (a killed engine
    process must not leave a worker burning CPU on an abandoned grammar).

    Polls the parent id from a thread (the compile holds no lock this thread needs).
    ``PR_SET_PDEATHSIG`` is not used: it fires when the *thread* that started the worker
    exits, and workers are started from short-lived threads.
    """
    parent = os.getppid()

    def watch() -> None:
        while True:
            time.sleep(0.5)
            if os.getppid() != parent:
                os._exit(1)

    threading.Thread(target=watch, name="pg-parent-watch", daemon=True).start()


class _Duplex:
    """A pair of one-way connections used as one."""

    __slots__ = ("_r", "_w")

    def __init__(self, reader: Connection, writer: Connection) -> None:
        self._r, self._w = reader, writer

    def send(self, obj: Any) -> None:
        self._w.send(obj)

    def send_bytes(self, data: bytes) -> None:
        """Send an object already pickled (``recv`` on the other side unpickles it)."""
        self._w.send_bytes(data)

    def fileno(self) -> int:
        """The reading end's descriptor (readable when a message arrives)."""
        return self._r.fileno()

    def recv(self) -> Any:
        return self._r.recv()

    def poll(self, timeout: float) -> bool:
        return self._r.poll(timeout)

    def close(self) -> None:
        self._r.close()
        self._w.close()


def _build_engines(payloads: dict[str, Any]) -> dict[str, Any]:
    from .engines import engine_class

    return {name: engine_class(name).from_payload(payload) for name, payload in payloads.items()}


def _warm(engines: dict[str, Any]) -> None:
    """One small JSON compile per engine, so that every forked worker starts with the
    engine's first-use work done (a first compile took over ``local_below_s`` in a fresh
    worker and was shipped instead of recompiled)."""
    from .engines import compile_checked
    from .specs import GrammarSpec

    spec = GrammarSpec.json_schema({"type": "object", "properties": {"a": {"type": "integer"}}})
    for name, engine in engines.items():
        try:
            compile_checked(engine, spec)
        except Exception as exc:  # noqa: BLE001 - a warm-up only; the real compile reports
            log.info("engine %s not warmed in the fork server: %s", name, exc)


def _serve(conn: Any, payloads: dict[str, Any], local_below_s: float) -> None:
    engines = _build_engines(payloads)
    conn.send(("ready", os.getpid()))
    _serve_engines(conn, engines, local_below_s)


def _serve_engines(conn: Any, engines: dict[str, Any], local_below_s: float) -> None:
    from .engines import EmptyLanguage, UnsupportedSpec, compile_checked
    from .specs import GrammarSpec

    # Specs whose first compile here took local_below_s or more. The engine's own cache makes
    # a repeat fast here, but not in the parent, which never compiled it (it was shipped):
    # redone there, it would take the full time with no limit. Bounded: oldest forgotten.
    slow: dict[tuple[str, str], None] = {}
    while True:
        try:
            job = conn.recv()
        except EOFError:
            return
        if job is None:
            return
        job_id, engine_name, spec_dict, serialize = job
        t0 = time.perf_counter()
        try:
            # "raw:<engine>": the library's own compile (baselines; Engine.compile_raw).
            raw = engine_name.startswith("raw:")
            engine = engines[engine_name.removeprefix("raw:")]
            spec = GrammarSpec.from_dict(spec_dict)
            if serialize == "prepare" and not raw:
                prepared = _prepare_only(engine, spec)
                if prepared is not None:  # checked, not compiled: the parent compiles it
                    conn.send((job_id, ("ok", {"prepared": prepared},
                                        time.perf_counter() - t0)))
                    continue
            keeping: Any = _KeepPrepared(engine)  # an Engine for compile_checked
            compiled = engine.compile_raw(spec) if raw else compile_checked(keeping, spec)
            seconds = time.perf_counter() - t0
            seen = (engine_name, spec.key)
            if seconds >= local_below_s:
                slow[seen] = None
                if len(slow) > _SLOW_SPECS_KEPT:
                    del slow[next(iter(slow))]
            ship = serialize == "always" or (serialize == "auto" and (
                seconds >= local_below_s or seen in slow))
            text: Any = engine.serialize(compiled) if ship else None
            if (text is None and serialize in ("auto", "prepared", "prepare")
                    and keeping.prepared is not None):
                # The parent recompiles exactly this, without the checks run here.
                text = {"prepared": keeping.prepared}
            conn.send((job_id, ("ok", text, seconds)))
        except UnsupportedSpec as exc:
            conn.send((job_id, ("unsupported", str(exc), time.perf_counter() - t0)))
        except EmptyLanguage as exc:
            conn.send((job_id, ("empty", str(exc), time.perf_counter() - t0)))
        except Exception as exc:  # noqa: BLE001 - the engine's diagnosis goes to the request
            conn.send((job_id, ("error", f"{type(exc).__name__}: {exc}",
                                time.perf_counter() - t0)))


def _prepares(engine: Any, spec: Any) -> bool:
    """Whether ``engine`` compiles ``spec`` in two steps, ``prepare`` (the checks) and
    ``compile_prepared`` (see ``XGrammarEngine.prepare``)."""
    return spec.kind == "json_schema" and hasattr(engine, "prepare")


def _prepare_only(engine: Any, spec: Any) -> Any:
    """What ``engine.prepare`` returns for ``spec`` (every check run, nothing compiled), or
    None where the engine has no such step (the job then compiles as ``"prepared"``)."""
    if not _prepares(engine, spec):
        return None
    spec.run_deferred_check()
    return engine.prepare(spec)


class _KeepPrepared:
    """An engine whose compile keeps what the engine's ``prepare`` returned (engines that
    have one: see ``XGrammarEngine.prepare``), for the reply."""

    def __init__(self, engine: Any) -> None:
        self._engine = engine
        self.prepared: Any = None

    def compile(self, spec: Any) -> Any:
        if not _prepares(self._engine, spec):
            return self._engine.compile(spec)
        self.prepared = self._engine.prepare(spec)
        return self._engine.compile_prepared(self.prepared)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._engine, name)


class _Forked:
    """A worker forked by the fork server: not our child, so it is signalled through a pid
    file descriptor (never another process that reused its pid) and waited for by polling
    that descriptor (readable once the process has exited).

    Thread-safe: the pool's close and its reaper may wait for one worker at once. Waiters
    take turns (one lock), and only a waiter closes the descriptor, once the exit is seen:
    a second waiter must not select on a descriptor closed (or its number reused) meanwhile.
    """

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.returncode: int | None = None
        self._waiting = threading.Lock()
        self._closing = threading.Lock()
        try:
            self._pidfd: int | None = os.pidfd_open(pid)
        except (AttributeError, OSError):  # no pidfd (old kernel), or it is gone already
            self._pidfd = None

    def kill(self) -> None:
        with self._closing, contextlib.suppress(ProcessLookupError, OSError):
            if self.returncode is not None:
                return
            if self._pidfd is not None:
                signal.pidfd_send_signal(self._pidfd, signal.SIGKILL)
            else:
                os.kill(self.pid, signal.SIGKILL)

    def poll(self) -> int | None:
        """None while it runs; -9 once gone (its real status went to the fork server)."""
        if self.returncode is not None:
            return self.returncode
        pidfd = self._pidfd
        if pidfd is None:
            try:
                os.kill(self.pid, 0)
                return None
            except OSError:
                self.returncode = -signal.SIGKILL
                return self.returncode
        try:
            gone = _readable(pidfd, 0)
        except OSError:  # closed meanwhile by wait(), which sets the code before closing it
            gone = True
        if gone:
            self.returncode = -signal.SIGKILL
        return self.returncode

    def wait(self, timeout: float) -> int:
        deadline = time.monotonic() + timeout
        if not self._waiting.acquire(timeout=max(0.0, timeout)):
            raise subprocess.TimeoutExpired(f"pid {self.pid}", timeout)
        try:
            while self.poll() is None:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise subprocess.TimeoutExpired(f"pid {self.pid}", timeout)
                if self._pidfd is not None:
                    _readable(self._pidfd, left)
                else:
                    time.sleep(min(0.01, left))
            with self._closing:  # (kill() must not signal a number reused meanwhile)
                if self._pidfd is not None:
                    with contextlib.suppress(OSError):
                        os.close(self._pidfd)
                    self._pidfd = None
        finally:
            self._waiting.release()
        return -signal.SIGKILL


def _readable(fd: int, timeout: float) -> bool:
    with selectors.DefaultSelector() as sel:
        sel.register(fd, selectors.EVENT_READ)
        return bool(sel.select(timeout))


class _ForkServer:
    """The process workers are forked from (:func:`_fork_server`): started once per pool,
    again only if it died."""

    def __init__(self, spec: dict[str, Any], local_below_s: float, timeout_s: float) -> None:
        ours, theirs = socket.socketpair()
        entry = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_worker_entry.py")
        try:
            self.proc = subprocess.Popen(
                [sys.executable, entry, "--fork-server", str(theirs.fileno())],
                pass_fds=(theirs.fileno(),), stdin=subprocess.DEVNULL,
            )
        finally:
            theirs.close()
        self._sock = ours
        self._conn = Connection(os.dup(ours.fileno()))
        self._lock = threading.Lock()
        try:
            self._conn.send((spec, local_below_s))
            if not self._conn.poll(timeout_s):
                raise RuntimeError(f"compile fork server did not start in {timeout_s} s")
            self._conn.recv()
        except BaseException:
            self.close()
            raise

    def alive(self) -> bool:
        return self.proc.poll() is None

    def fork(self, timeout_s: float) -> _Worker:
        """A new worker, ready for jobs."""
        with self._lock:
            self._conn.send("fork")
            if not _readable(self._sock.fileno(), timeout_s):
                raise RuntimeError(f"compile fork server did not fork in {timeout_s} s")
            msg, fds, _, _ = socket.recv_fds(self._sock, 16, 1)
        if len(msg) != 4 or len(fds) != 1:
            for fd in fds:
                os.close(fd)
            raise RuntimeError("compile fork server closed its connection")
        (pid,) = struct.unpack("!i", msg)
        worker = _Worker(_Forked(pid), Connection(fds[0]))
        if not worker.conn.poll(timeout_s):
            worker.kill()
            raise RuntimeError(f"forked compile worker {pid} did not start in {timeout_s} s")
        worker.conn.recv()
        return worker

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.proc.kill()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=10)
        self._conn.close()
        self._sock.close()


class _Worker:
    __slots__ = ("conn", "niced", "proc", "send_lock")

    def __init__(self, proc: Any, conn: Any) -> None:
        self.proc = proc
        self.conn = conn
        #: Its priority was lowered (a long compile, a background job): retired after that
        #: job, or kept for background jobs only (one that ran a background job).
        self.niced = False
        # Held while a job is written: the pipe is closed only once no write is in flight
        # (its descriptor number could otherwise be reused by a new pipe mid-write).
        self.send_lock = threading.Lock()

    def kill(self) -> None:
        try:
            self.proc.kill()
        except OSError:
            pass
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:  # pragma: no cover - SIGKILL is not ignorable
            log.error("compile worker %s did not exit after SIGKILL", self.proc.pid)
        # A write blocked on the dead worker's pipe fails now (EPIPE) and lets go.
        with self.send_lock:
            self.conn.close()


def _start_worker() -> _Worker:
    p2c_r, p2c_w = os.pipe()
    c2p_r, c2p_w = os.pipe()
    # By file path: the script puts the package root after the standard library.
    entry = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_worker_entry.py")
    try:
        proc = subprocess.Popen(
            [sys.executable, entry, str(p2c_r), str(c2p_w)],
            pass_fds=(p2c_r, c2p_w), stdin=subprocess.DEVNULL,
        )
    finally:
        os.close(p2c_r)
        os.close(c2p_w)
    conn = _Duplex(Connection(c2p_r, writable=False), Connection(p2c_w, readable=False))
    return _Worker(proc, conn)


class _Job:
    """One compile handed to the pool: waiting for a worker, then running in one."""

    __slots__ = ("attempt", "background", "before_ready", "deadline", "done", "engine",
                 "job_id", "payload", "queued_at", "started_at", "timeout_s")

    def __init__(self, job_id: int, engine: str, payload: bytes, timeout_s: float,
                 done: Callable[[WorkerReply | BaseException], None], deadline: float) -> None:
        self.job_id = job_id
        self.engine = engine
        self.payload = payload
        self.timeout_s = timeout_s
        self.done = done
        self.attempt = 1
        self.queued_at = time.monotonic()
        self.started_at = math.inf
        #: When the job must have resolved (monotonic), waiting for a worker included.
        self.deadline = deadline
        #: Submitted before the pool's first worker was ready: that wait does not count.
        self.before_ready = False
        #: Runs only while no other compile waits, at the long lane's priority.
        self.background = False


class WorkerPool:
    """Compile worker processes, each able to run every engine.

    Scheduling (docs/latency.md, "Latency model"): at most ``size`` compiles run at normal
    priority; one that has run ``long_after_s`` while others wait moves to the long lane
    (its process's priority lowered, at most ``max_long`` such compiles), so a pathological
    spec holds a slot for ``long_after_s``, not for its whole limit; waiting jobs go smallest
    first (their size halving every :data:`_AGING_S` of waiting, so none starves);
    ``spares`` idle workers are kept ready beyond those, so a compile after a kill starts
    at once. Workers are forked from a fork server (module doc) where ``fork`` exists.

    ``engines_spec`` is a callable returning ``{engine name: tokenizer payload}`` (the
    payload from ``engine_class(name).tokenizer_payload(info)``); it is called once, in a
    background thread, when the first worker starts (building the payloads takes a moment),
    so constructing the pool never blocks.

    One reader thread waits for every worker's reply at once (a selector over the reply
    pipes) and enforces every deadline; a job is written to an idle worker by the thread
    that submits it, so a compile crosses no thread until its reply is read, and the reply
    is handed to the job's callback right in the reader. A thread per waiting job made each
    compile win the GIL several times from a busy engine loop (5 ms a hand-over at Python's
    default switch interval: bench/bench_compile_gil.py).
    """

    def __init__(
        self,
        engines_spec: Callable[[], dict[str, Any]],
        *,
        size: int = 1,
        local_below_s: float = 0.1,
        start_timeout_s: float = 120.0,
        on_kill: Callable[[], None] | None = None,
        spares: int = 1,
        long_after_s: float = 0.1,
        max_long: int = 8,
        fork_server: bool | None = None,
    ) -> None:
        if size < 1:
            raise ValueError(f"compile worker pool size must be >= 1, got {size}")
        if spares < 0 or max_long < 0 or not long_after_s > 0:
            raise ValueError(f"spares and max_long must be >= 0 and long_after_s > 0, got "
                             f"{spares}, {max_long}, {long_after_s}")
        self.size = size
        self.spares = spares
        self.long_after_s = long_after_s
        self.max_long = max_long
        self._use_fork_server = (hasattr(os, "fork") and hasattr(socket, "send_fds")
                                 if fork_server is None else fork_server)
        self._server: _ForkServer | None = None
        self._spec_fn = engines_spec
        self._spec: dict[str, Any] | None = None
        self._spec_lock = threading.Lock()
        self._local_below_s = local_below_s
        self._start_timeout_s = start_timeout_s
        self._on_kill = on_kill
        # Guards the worker sets, the jobs and _wake_at (never held while writing to a pipe).
        self._lock = threading.Lock()
        self._all: set[_Worker] = set()
        self._idle: list[_Worker] = []
        # Niced workers kept for background jobs (engine upgrades): retiring each one after
        # its job made every compile after an upgrade land on a just-forked worker, about
        # 3x slower than a used one (its copy-on-write pages still shared).
        self._idle_background: list[_Worker] = []
        self._busy: dict[_Worker, _Job] = {}
        self._waiting: collections.deque[_Job] = collections.deque()
        self._started: list[_Worker] = []  # ready, not yet watched by the reader
        self._ids = itertools.count()
        self._closed = False
        self._spawners: list[threading.Thread] = []
        self._starting = 0  # workers being started
        self._respawn_at = 0.0  # no start before this (monotonic) after a failed one
        # Writes of large jobs (rare); its thread starts at the first one.
        self._sender = ThreadPoolExecutor(1, thread_name_prefix="pg-compile-send")
        # Waits for killed workers to exit: a compile's memory takes up to a few hundred ms
        # to free, which the reader (and the next deadline) must not wait for.
        self._reaper = ThreadPoolExecutor(1, thread_name_prefix="pg-compile-reap")
        self.start_error: BaseException | None = None
        #: When the first worker became ready (monotonic), None before.
        self.ready_at: float | None = None
        #: When the reader's wait ends at the latest (monotonic): a job due earlier wakes it.
        self._wake_at = math.inf
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        os.set_blocking(self._wake_w, False)
        self._selector = selectors.DefaultSelector()
        self._selector.register(self._wake_r, selectors.EVENT_READ, None)
        self._reader = threading.Thread(target=self._read_loop, name="pg-compile-reader",
                                        daemon=True)
        self._reader.start()
        for _ in range(size + spares):
            self._spawn_async()

    # -- lifecycle -------------------------------------------------------------------------
    def _spawn_async(self) -> None:
        thread = threading.Thread(target=self._spawn, name="pg-compile-spawn", daemon=True)
        with self._lock:  # callers: submitting threads and the reader
            if self._closed:
                return
            self._starting += 1
            self._spawners = [t for t in self._spawners if t.is_alive()] + [thread]
            # Started under the lock: close() joins every thread listed, and joining one
            # not yet started raises (start() returns once the thread runs; _spawn takes
            # the lock only later).
            thread.start()

    def _top_up(self) -> None:
        """Start the workers the pool lacks (a start that failed, a replacement that did
        not come up), at most once per :data:`_RESPAWN_BACKOFF_S` after a failure."""
        with self._lock:
            # Long-lane workers are extra: retired when their compile ends (one that ran a
            # background job is kept for the next).
            regular = len(self._all) - sum(w.niced for w in self._all)
            missing = self.size + self.spares - regular - self._starting
            if self._closed or missing <= 0 or time.monotonic() < self._respawn_at:
                return
        for _ in range(missing):
            self._spawn_async()

    def _spawn(self) -> None:
        try:
            self._start_one()
        finally:
            with self._lock:
                self._starting -= 1

    def _start_one(self) -> None:
        try:
            worker = self._new_worker()
        except BaseException as exc:  # noqa: BLE001 - reported by run() to the waiting compile
            log.error("compile worker failed to start: %s (trying again in %g s)", exc,
                      _RESPAWN_BACKOFF_S)
            with self._lock:
                self.start_error = exc
                self._respawn_at = time.monotonic() + _RESPAWN_BACKOFF_S
            self._wake()  # jobs waiting with no worker left may now time out
            return
        with self._lock:
            if self._closed:
                worker.kill()
                return
            self._all.add(worker)
            self._started.append(worker)
            if self.ready_at is None:
                # The pool's start is not the grammar's time: a job that waited for it
                # gets its whole limit from now.
                self.ready_at = now = time.monotonic()
                for job in self._waiting:
                    if job.before_ready:
                        job.deadline += now - job.queued_at
        self._wake()

    def _new_worker(self) -> _Worker:
        """A worker ready for jobs: forked from the fork server (started first if it is not
        running), or a fresh interpreter where there is none."""
        with self._spec_lock:
            if self._spec is None:
                self._spec = self._spec_fn()
            server = None
            if self._use_fork_server:
                if self._server is None or not self._server.alive():
                    if self._server is not None:
                        self._server.close()
                        log.warning("compile fork server died; starting another")
                    self._server = None
                    self._server = _ForkServer(self._spec, self._local_below_s,
                                               self._start_timeout_s)
                server = self._server
        if server is not None:
            return server.fork(self._start_timeout_s)
        worker = _start_worker()
        worker.conn.send((self._spec, self._local_below_s))
        if not worker.conn.poll(self._start_timeout_s):
            worker.kill()
            raise RuntimeError(f"compile worker did not start in {self._start_timeout_s} s")
        worker.conn.recv()
        return worker

    def close(self) -> None:
        """Stop every worker (idle or busy); compiles waiting for a worker or running in one
        fail at once with :class:`RuntimeClosed`.

        Waits for workers still starting: a thread left inside the engine libraries while
        the interpreter shuts down would abort the process.
        """
        with self._lock:
            self._closed = True
        self._wake()
        for thread in self._spawners:
            thread.join(timeout=self._start_timeout_s)
        with self._lock:
            workers = list(self._all)
            self._all.clear()
        for w in workers:
            w.kill()
        with self._spec_lock:
            if self._server is not None:
                self._server.close()
                self._server = None
        if threading.current_thread() is not self._reader:
            self._reader.join(timeout=10)
        self._sender.shutdown(wait=False)
        self._reaper.shutdown(wait=True)

    def pids(self) -> list[int]:
        """Process ids of the live workers."""
        with self._lock:
            return [w.proc.pid for w in self._all]

    def busy_pids(self) -> list[int]:
        """Process ids of the workers running a compile, oldest job first."""
        with self._lock:
            return [w.proc.pid for w, _ in sorted(self._busy.items(),
                                                   key=lambda item: item[1].started_at)]

    # -- running ---------------------------------------------------------------------------
    def submit(self, engine: str, spec_dict: dict[str, Any], timeout_s: float,
               serialize: str, done: Callable[[WorkerReply | BaseException], None],
               *, deadline: float | None = None, background: bool = False) -> None:
        """Compile in a worker; ``done`` gets the reply, or the error: :class:`GrammarTimeout`
        (no reply by ``deadline``, a ``time.monotonic()`` instant, default ``timeout_s``
        from now: the time spent waiting for a worker counts; a job still waiting at its
        deadline never starts, a running one has its worker killed),
        :class:`CompileWorkerLost` (also when no worker could be started within
        ``start_timeout_s``; a failed start is retried), or :class:`RuntimeClosed`. Never
        blocks; ``done`` runs in the pool's reader thread (or in this one, for an error
        known at once) and must return quickly.

        A worker that dies (before or during the job) is replaced and the job retried once
        on the new one; a second death gives :class:`CompileWorkerLost`, which callers must
        not cache as a property of the grammar.

        ``serialize``: ``"auto"`` ships the grammar when its compile took at least
        ``local_below_s``, ``"always"`` ships it, ``"never"`` only reports that it compiled
        (the parent compiled it too: ``CompileService(race=True)``), ``"prepared"`` never
        ships it but sends what the engine's ``prepare`` returned (the parent recompiles it
        without the checks), ``"prepare"`` sends that without compiling at all (the parent
        compiles it, once; as ``"prepared"`` for an engine or spec kind with no such step).

        ``background``: the job starts only while no other compile waits, on a worker
        whose priority is lowered at once (the long lane's: it holds no slot); that worker
        is then kept, idle, for the next background job (:data:`_BACKGROUND_KEPT`), so
        background jobs do not turn the regular workers over; ``CompileService``'s engine
        upgrades."""
        if serialize not in _SERIALIZE:
            raise ValueError(f"serialize must be one of {', '.join(map(repr, _SERIALIZE))}, "
                             f"got {serialize!r}")
        job_id = next(self._ids)
        payload = _dumps((job_id, engine, spec_dict, serialize))
        job = _Job(job_id, engine, payload, timeout_s, done,
                   time.monotonic() + timeout_s if deadline is None else deadline)
        job.background = background
        with self._lock:
            if self._closed:
                raise RuntimeClosed("the compile workers were stopped (runtime closed)")
            job.before_ready = self.ready_at is None
            self._waiting.append(job)
            assigned = self._assign()
            # Not started: the reader must wake for its deadline, or to move a running
            # compile to the long lane.
            wake = job.deadline < self._wake_at or not assigned
        self._send_all(assigned)
        self._top_up()
        if wake:
            self._wake()

    def run(self, engine: str, spec_dict: dict[str, Any], timeout_s: float,
            serialize: str = "auto", *, deadline: float | None = None,
            background: bool = False) -> WorkerReply:
        """:meth:`submit` and wait: the reply, or its error raised."""
        outcome: Future[WorkerReply] = Future()

        def done(reply: WorkerReply | BaseException) -> None:
            if isinstance(reply, BaseException):
                outcome.set_exception(reply)
            else:
                outcome.set_result(reply)

        self.submit(engine, spec_dict, timeout_s, serialize, done, deadline=deadline,
                    background=background)
        return outcome.result()

    # -- the reader thread -----------------------------------------------------------------
    def _wake(self) -> None:
        with contextlib.suppress(BlockingIOError, OSError):  # full: it wakes anyway
            os.write(self._wake_w, b"\0")

    def _assign(self) -> list[tuple[_Worker, _Job]]:
        """Idle workers take waiting jobs while fewer than ``size`` run at normal priority
        (smallest aged job first: :func:`_rank`); caller holds the lock."""
        pairs = []
        now = time.monotonic()
        young = sum(not w.niced for w in self._busy)
        lane = len(self._busy) - young
        while self._waiting:
            foreground = [j for j in self._waiting if not j.background]
            if foreground:
                if young >= self.size or not self._idle:
                    break  # (a background job waits while any other does)
                job = min(foreground, key=lambda j: _rank(j, now))
                worker = self._idle.pop()
            elif lane < self.max_long and (self._idle_background or self._idle):
                job = self._waiting[0]  # background jobs in submission order
                # Else the regular worker used least (it is replaced by a fresh one).
                worker = (self._idle_background.pop() if self._idle_background
                          else self._idle.pop(0))
            else:
                break
            self._waiting.remove(job)
            job.started_at = now
            self._busy[worker] = job
            pairs.append((worker, job))
            if job.background:
                worker.niced = True
                with contextlib.suppress(OSError):  # gone: the reader sees it next
                    os.setpriority(os.PRIO_PROCESS, worker.proc.pid, _LONG_NICE)
                lane += 1
            else:
                young += 1
        return pairs

    def _promote(self) -> list[tuple[_Worker, _Job]]:
        """Move compiles that ran ``long_after_s`` while others wait to the long lane (their
        worker's priority lowered); the jobs that then start."""
        now = time.monotonic()
        with self._lock:
            if not self._waiting:
                return []
            lane = sum(w.niced for w in self._busy)
            for worker, job in sorted(self._busy.items(), key=lambda item: item[1].started_at):
                if lane >= self.max_long:
                    break
                if not worker.niced and now - job.started_at >= self.long_after_s:
                    worker.niced = True
                    lane += 1
                    with contextlib.suppress(OSError):  # gone: the reader sees it next
                        os.setpriority(os.PRIO_PROCESS, worker.proc.pid, _LONG_NICE)
            return self._assign()

    def _send_all(self, pairs: list[tuple[_Worker, _Job]]) -> None:
        for worker, job in pairs:
            if len(job.payload) <= _INLINE_SEND_BYTES:
                # An idle worker has read every byte sent to it: this fits in its empty
                # pipe, so the write cannot block.
                self._send(worker, job)
            else:  # could block while the worker reads: never in the caller or the reader
                with contextlib.suppress(RuntimeError):  # closed: the job fails anyway
                    self._sender.submit(self._send, worker, job)

    @staticmethod
    def _send(worker: _Worker, job: _Job) -> None:
        # A failed write means a dead worker: the reader sees its pipe close and retries.
        with worker.send_lock, contextlib.suppress(OSError, ValueError):
            worker.conn.send_bytes(job.payload)

    def _read_loop(self) -> None:
        try:
            while self._read_once():
                pass
        finally:
            self._fail_all()
            self._selector.close()
            os.close(self._wake_r)
            os.close(self._wake_w)

    def _read_once(self) -> bool:
        """One wait for replies, wake-ups and deadlines; False once the pool is closed."""
        try:
            with self._lock:
                if self._closed:
                    return False
                started, self._started = self._started, []
            for worker in started:
                self._selector.register(worker.conn.fileno(), selectors.EVENT_READ, worker)
                self._release(worker, fresh=True)
            timeout = self._timeout()
            for key, _ in self._selector.select(timeout):
                if key.data is None:
                    with contextlib.suppress(BlockingIOError):
                        while os.read(self._wake_r, 512):
                            pass
                else:
                    self._on_readable(key.data)
            self._expire()
        except Exception:  # pragma: no cover - a bug here must not stop every compile
            log.exception("compile pool reader failed; going on")
            time.sleep(0.1)
        return True

    def _timeout(self) -> float:
        """Seconds until the next deadline, or :data:`_READER_TICK_S` at most; records when
        the wait ends."""
        now = time.monotonic()
        with self._lock:
            due = min((job.deadline for job in (*self._busy.values(), *self._waiting)
                       if self._clock_runs(job)), default=now + _READER_TICK_S)
            if not self._all and self._waiting:  # no worker: a start may have failed
                due = min(due, self._waiting[0].queued_at + self._start_timeout_s)
            if self._waiting:  # a running compile may move to the long lane
                due = min([due, *(job.started_at + self.long_after_s
                                  for w, job in self._busy.items() if not w.niced)])
            self._wake_at = due = min(due, now + _READER_TICK_S)
        return max(0.0, due - now)

    def _clock_runs(self, job: _Job) -> bool:
        """Whether ``job``'s deadline is running (a job submitted before the pool's first
        worker was ready waits for it off the clock)."""
        return self.ready_at is not None or not job.before_ready

    def _release(self, worker: _Worker, fresh: bool = False) -> None:
        """``worker`` is free: it takes the oldest waiting job, or idles. A ``fresh`` one
        (just forked) is taken last: its first compiles are slower."""
        with self._lock:
            if fresh:
                self._idle.insert(0, worker)
            else:
                self._idle.append(worker)
            assigned = self._assign()
        self._send_all(assigned)
        if any(job.background for _, job in assigned):
            self._top_up()  # its worker joined the long lane: a regular one is missing

    def _release_niced(self, worker: _Worker, job: _Job) -> None:
        """A long-lane worker is free: kept for background jobs if it ran one (up to
        :data:`_BACKGROUND_KEPT`; a long foreground compile may have left it large), else
        retired."""
        with self._lock:
            keep = (job.background and not self._closed
                    and len(self._idle_background) < _BACKGROUND_KEPT)
            if keep:
                self._idle_background.append(worker)
                assigned = self._assign()
        if not keep:
            self._retire(worker, replace=False)
            return
        self._send_all(assigned)

    def _on_readable(self, worker: _Worker) -> None:
        try:
            reply_id, reply = _read_message(worker.conn.fileno())
        except Exception as exc:  # noqa: BLE001 - EOF, a broken pipe or a torn message
            self._lost(worker, exc)
            return
        with self._lock:
            job = self._busy.pop(worker, None)
        if job is None or reply_id != job.job_id:
            if job is not None:
                with self._lock:
                    self._busy[worker] = job
            self._lost(worker, RuntimeError(
                f"worker replied to job {reply_id}, expected "
                f"{job.job_id if job is not None else 'none'}"))
            return
        if worker.niced:  # its priority cannot be raised again; long-lane workers are extras
            self._release_niced(worker, job)
        else:
            self._release(worker)  # the next compile starts before this reply is handled
        _deliver(job, reply)

    def _retire(self, worker: _Worker, replace: bool = True) -> _Job | None:
        """Stop watching ``worker``, kill it, start the workers the pool lacks; its job,
        if any."""
        with contextlib.suppress(KeyError, ValueError, OSError):
            self._selector.unregister(worker.conn.fileno())
        with self._lock:
            job = self._busy.pop(worker, None)
            self._all.discard(worker)
            for idle in (self._idle, self._idle_background):
                if worker in idle:
                    idle.remove(worker)
        with contextlib.suppress(OSError):
            worker.proc.kill()  # stopped now; its exit is waited for elsewhere
        try:
            self._reaper.submit(worker.kill)
        except RuntimeError:  # closing
            worker.kill()
        if replace:
            self._top_up()
        return job

    def _lost(self, worker: _Worker, exc: BaseException) -> None:
        job = self._retire(worker)
        if job is None:
            if not self._closed:
                log.warning("idle compile worker %s had exited (code %s); starting another",
                            worker.proc.pid, worker.proc.returncode)
            return
        if self._closed:
            _deliver(job, RuntimeClosed("the compile workers were stopped (runtime closed)"))
            return
        lost = CompileWorkerLost(
            f"compile worker {worker.proc.pid} died ({type(exc).__name__}: {exc}; exit "
            f"code {worker.proc.poll()})" + (" twice" if job.attempt > 1 else ""),
            engine=job.engine)
        if job.attempt > 1:
            _deliver(job, lost)
            return
        log.warning("%s; retrying the compile on a new worker", lost)
        job.attempt += 1
        job.queued_at = time.monotonic()  # the deadline stays: it counts from submission
        with self._lock:
            self._waiting.appendleft(job)
            assigned = self._assign()
        self._send_all(assigned)

    def _expire(self) -> None:
        """Kill the workers whose job is past its deadline; fail jobs with no worker to
        run them; move long compiles aside; start the workers the pool lacks."""
        self._send_all(self._promote())
        self._top_up()
        now = time.monotonic()
        with self._lock:
            late = [w for w, job in self._busy.items() if job.deadline <= now]
            # Jobs whose whole limit went by in the queue never start.
            expired = [job for job in self._waiting
                       if job.deadline <= now and self._clock_runs(job)]
            for job in expired:
                self._waiting.remove(job)
            stranded: list[_Job] = []
            if not self._all:
                while self._waiting and (self._waiting[0].queued_at + self._start_timeout_s
                                         <= now):
                    stranded.append(self._waiting.popleft())
        for worker in late:
            killed = self._retire(worker)
            if killed is None:
                continue
            if self._on_kill is not None:
                self._on_kill()
            _deliver(killed, GrammarTimeout(
                f"compile exceeded its time limit of {killed.timeout_s:g} s (counted from "
                f"submission); worker killed after {now - killed.started_at:.2f} s of "
                f"compiling, {killed.started_at - killed.queued_at:.2f} s after waiting",
                engine=killed.engine))
        for job in expired:
            _deliver(job, GrammarTimeout(
                f"compile waited its whole time limit of {job.timeout_s:g} s for a free "
                f"compile worker and never started", engine=job.engine, started=False))
        for job in stranded:  # an infrastructure fault: CompileWorkerLost is never cached
            _deliver(job, CompileWorkerLost(
                f"no compile worker became available in {self._start_timeout_s} s"
                + (f" (last start error: {self.start_error})" if self.start_error else ""),
                engine=job.engine))

    def _fail_all(self) -> None:
        with self._lock:
            jobs = [*self._waiting, *self._busy.values()]
            self._waiting.clear()
            self._busy.clear()
        for job in jobs:
            _deliver(job, RuntimeClosed("the compile workers were stopped (runtime closed)"))


#: Slow specs a worker remembers, so that a repeat it answers from its engine's cache is
#: still shipped (:func:`_serve`).
_SLOW_SPECS_KEPT = 4096

#: Long-lane workers kept, idle, for background jobs (at their lowered priority).
_BACKGROUND_KEPT = 1

#: The niceness of a worker whose compile moved to the long lane: the kernel then gives
#: normal-priority compiles about ten times its CPU share.
_LONG_NICE = 10

#: A waiting job's size (what ranks it) halves every this many seconds of waiting.
_AGING_S = 0.5


def _rank(job: _Job, now: float) -> float:
    """Smallest first: the bigger the spec the longer its compile tends to take; aged, so a
    big spec waits a bounded time."""
    return len(job.payload) * 0.5 ** ((now - job.queued_at) / _AGING_S)


#: After a worker failed to start, the pool tries again at most this often.
_RESPAWN_BACKOFF_S = 1.0

#: The reader's longest wait. A job due after the reader's next wake-up does not wake it
#: (with the default limits, none does): waking it at every submit made it wait for the
#: GIL, drain its wake-up pipe and wait again, right when the job's reply was coming
#: (a few GIL hand-overs per compile against a busy engine loop).
_READER_TICK_S = 1.0

#: Jobs up to this size are written by the submitting thread: an idle worker's pipe is
#: empty and holds 64 KiB on Linux, so the write returns at once.
_INLINE_SEND_BYTES = 32 << 10


def _read_message(fd: int) -> Any:
    """One message as ``Connection.send`` writes it (a big-endian int32 length, or -1 and a
    uint64 length, then the pickle), in as few reads as it arrived in: a reply of up to
    16 KiB (one write) takes one read, done holding the GIL (:func:`_read_ready`).
    ``Connection.recv`` read the length and the body apart, each read letting go of the
    GIL, which a busy engine loop then held for up to a switch interval. Call it only once
    the selector found ``fd`` readable: the first read must not wait."""
    data = _read_at_least(fd, _read_ready(fd, 1 << 16), 4)
    (size,), start = struct.unpack("!i", data[:4]), 4
    if size == -1:
        data = _read_at_least(fd, data, 12)
        (size,), start = struct.unpack("!Q", data[4:12]), 12
    chunks, have, need = [data], len(data), start + size
    while have < need:
        more = os.read(fd, min(need - have, 1 << 20))
        if not more:
            raise EOFError("the worker closed its pipe mid-message")
        chunks.append(more)
        have += len(more)
    if have != need:  # a worker writes one reply per job: more is a broken protocol
        raise RuntimeError(f"worker sent {have - need} bytes beyond its reply")
    return pickle.loads(b"".join(chunks)[start:])


def _libc_read() -> Any:
    """libc's ``read`` called without letting go of the GIL (``ctypes.PyDLL``), or None."""
    try:
        read = ctypes.PyDLL(None, use_errno=True).read
    except (OSError, AttributeError):  # pragma: no cover - no libc symbols to find
        return None
    read.argtypes = (ctypes.c_int, ctypes.c_void_p, ctypes.c_size_t)
    read.restype = ctypes.c_ssize_t
    return read


_READ_HOLDING_GIL = _libc_read()


def _read_ready(fd: int, n: int) -> bytes:
    """Up to ``n`` bytes from ``fd``, which the selector found readable, so the read returns
    at once: done holding the GIL, as it takes microseconds, while ``os.read`` would let a
    busy thread take the GIL and the reader wait a switch interval to get it back."""
    if _READ_HOLDING_GIL is None:
        return os.read(fd, n)
    buf = ctypes.create_string_buffer(n)
    got = _READ_HOLDING_GIL(fd, buf, n)
    if got < 0:
        err = ctypes.get_errno()
        if err in (errno.EINTR, errno.EAGAIN):
            return os.read(fd, n)
        raise OSError(err, os.strerror(err))
    return buf.raw[:got]


def _read_at_least(fd: int, data: bytes, n: int) -> bytes:
    while len(data) < n:
        more = os.read(fd, n - len(data))
        if not more:
            raise EOFError("the worker closed its pipe" + (" mid-message" if data else ""))
        data += more
    return data


def _dumps(obj: Any) -> bytes:
    return pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)


def _deliver(job: _Job, outcome: WorkerReply | BaseException) -> None:
    try:
        job.done(outcome)
    except Exception:  # a caller's callback must not stop the reader
        log.exception("compile job callback failed")

#: What a job's reply carries (``WorkerPool.submit``'s ``serialize``).
_SERIALIZE = ("auto", "always", "never", "prepared", "prepare")
