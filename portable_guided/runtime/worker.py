"""Compile worker processes: the time limit that really stops a compile.

A compile runs in a worker process; the parent waits for the reply until the deadline and
then kills the worker (SIGKILL), which frees its CPU and memory at once, and starts a
replacement in the background. The worker sends back the compiled grammar serialized, or,
when the compile took less than ``local_below_s`` (cheaper to redo than to serialize and
ship), only the news that the spec compiles fast, and the parent compiles it itself.
"""

from __future__ import annotations

import itertools
import logging
import os
import queue
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from multiprocessing.connection import Connection
from typing import Any

from .errors import CompileWorkerLost, GrammarCompileError, GrammarTimeout, RuntimeClosed

__all__ = ["WorkerPool", "WorkerReply"]

log = logging.getLogger(__name__)

#: (status, text, compile_seconds): status is "ok", "unsupported", "empty" or "error"; for "ok",
#: text is the serialized grammar or None (recompile locally).
WorkerReply = tuple[str, Any, float]


def main() -> None:
    """Entry point of a worker process (``python .../runtime/_worker_entry.py RFD WFD``).

    The worker is a fresh interpreter (not a fork, so none of the parent's threads or
    locks come along, and not ``multiprocessing`` spawn, which would re-run the caller's
    main module); it talks to the parent over two pipes.
    """
    rfd, wfd = int(sys.argv[1]), int(sys.argv[2])
    _die_with_parent()
    conn = _Duplex(Connection(rfd, writable=False), Connection(wfd, readable=False))
    payloads, local_below_s = conn.recv()
    _serve(conn, payloads, local_below_s)


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

    def recv(self) -> Any:
        return self._r.recv()

    def poll(self, timeout: float) -> bool:
        return self._r.poll(timeout)

    def close(self) -> None:
        self._r.close()
        self._w.close()


def _serve(conn: Any, payloads: dict[str, Any], local_below_s: float) -> None:
    from .engines import EmptyLanguage, UnsupportedSpec, compile_checked, engine_class
    from .specs import GrammarSpec

    engines = {name: engine_class(name).from_payload(payload)
               for name, payload in payloads.items()}
    conn.send(("ready", os.getpid()))
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
            compiled = engine.compile_raw(spec) if raw else compile_checked(engine, spec)
            seconds = time.perf_counter() - t0
            ship = serialize == "always" or (serialize == "auto" and seconds >= local_below_s)
            text = engine.serialize(compiled) if ship else None
            conn.send((job_id, ("ok", text, seconds)))
        except UnsupportedSpec as exc:
            conn.send((job_id, ("unsupported", str(exc), time.perf_counter() - t0)))
        except EmptyLanguage as exc:
            conn.send((job_id, ("empty", str(exc), time.perf_counter() - t0)))
        except Exception as exc:  # noqa: BLE001 - the engine's diagnosis goes to the request
            conn.send((job_id, ("error", f"{type(exc).__name__}: {exc}",
                                time.perf_counter() - t0)))


class _Worker:
    __slots__ = ("conn", "proc")

    def __init__(self, proc: Any, conn: Any) -> None:
        self.proc = proc
        self.conn = conn

    def kill(self) -> None:
        try:
            self.proc.kill()
        except OSError:
            pass
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:  # pragma: no cover - SIGKILL is not ignorable
            log.error("compile worker %s did not exit after SIGKILL", self.proc.pid)
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


class WorkerPool:
    """A fixed number of compile worker processes, each able to run every engine.

    ``engines_spec`` is a callable returning ``{engine name: tokenizer payload}`` (the
    payload from ``engine_class(name).tokenizer_payload(info)``); it is called once, in a
    background thread, when the first worker starts (building the payloads takes a moment),
    so constructing the pool never blocks.
    """

    def __init__(
        self,
        engines_spec: Callable[[], dict[str, Any]],
        *,
        size: int = 1,
        local_below_s: float = 0.1,
        start_timeout_s: float = 120.0,
        on_kill: Callable[[], None] | None = None,
    ) -> None:
        if size < 1:
            raise ValueError(f"compile worker pool size must be >= 1, got {size}")
        self.size = size
        self._spec_fn = engines_spec
        self._spec: dict[str, Any] | None = None
        self._spec_lock = threading.Lock()
        self._local_below_s = local_below_s
        self._start_timeout_s = start_timeout_s
        self._on_kill = on_kill
        self._idle: queue.Queue[_Worker | None] = queue.Queue()  # None: closed
        self._all: set[_Worker] = set()
        self._all_lock = threading.Lock()
        self._ids = itertools.count()
        self._closed = False
        self._spawners: list[threading.Thread] = []
        self.start_error: BaseException | None = None
        for _ in range(size):
            self._spawn_async()

    # -- lifecycle -------------------------------------------------------------------------
    def _spawn_async(self) -> None:
        if not self._closed:
            thread = threading.Thread(target=self._spawn, name="pg-compile-spawn", daemon=True)
            self._spawners = [t for t in self._spawners if t.is_alive()] + [thread]
            thread.start()

    def _spawn(self) -> None:
        try:
            with self._spec_lock:
                if self._spec is None:
                    self._spec = self._spec_fn()
            worker = _start_worker()
            worker.conn.send((self._spec, self._local_below_s))
            if not worker.conn.poll(self._start_timeout_s):
                worker.kill()
                raise RuntimeError(f"compile worker did not start in {self._start_timeout_s} s")
            worker.conn.recv()
        except BaseException as exc:  # noqa: BLE001 - reported by run() to the waiting compile
            log.error("compile worker failed to start: %s", exc)
            self.start_error = exc
            return
        with self._all_lock:
            if self._closed:
                worker.kill()
                return
            self._all.add(worker)
        self._idle.put(worker)

    def close(self) -> None:
        """Stop every worker (idle or busy); compiles waiting for a worker or running in one
        fail at once with :class:`RuntimeClosed`.

        Waits for workers still starting: a thread left inside the engine libraries while
        the interpreter shuts down would abort the process.
        """
        self._closed = True
        self._idle.put(None)  # wakes a run() waiting for a worker (passed on to the next)
        for thread in self._spawners:
            thread.join(timeout=self._start_timeout_s)
        with self._all_lock:
            workers = list(self._all)
            self._all.clear()
        for w in workers:
            w.kill()

    def pids(self) -> list[int]:
        """Process ids of the live workers."""
        with self._all_lock:
            return [w.proc.pid for w in self._all]

    # -- running ---------------------------------------------------------------------------
    def run(self, engine: str, spec_dict: dict[str, Any], timeout_s: float,
            serialize: str = "auto") -> WorkerReply:
        """Compile in a worker; raises :class:`GrammarTimeout` (after killing the worker) when
        no reply came within ``timeout_s`` of handing the job over.

        A worker that dies (before or during the job) is replaced and the job retried once
        on the new one; a second death raises :class:`CompileWorkerLost`, which callers must
        not cache as a property of the grammar.

        ``serialize``: ``"auto"`` ships the grammar when its compile took at least
        ``local_below_s``, ``"always"`` ships it, ``"never"`` only reports that it compiled
        (the parent compiled it too: ``CompileService(race=True)``)."""
        if serialize not in ("auto", "always", "never"):
            raise ValueError(f"serialize must be 'auto', 'always' or 'never', got {serialize!r}")
        attempt = 0
        while True:
            attempt += 1
            worker = self._take(engine)
            job_id = next(self._ids)
            t0 = time.monotonic()
            try:
                worker.conn.send((job_id, engine, spec_dict, serialize))
                if worker.conn.poll(timeout_s):
                    reply_id, reply = worker.conn.recv()
                    if reply_id != job_id:
                        raise RuntimeError(f"worker replied to job {reply_id}, expected {job_id}")
                    self._idle.put(worker)
                    return reply
            except (EOFError, OSError, RuntimeError) as exc:
                self._retire(worker)
                if self._closed:
                    raise RuntimeClosed("the compile workers were stopped (runtime closed)") \
                        from None
                lost = CompileWorkerLost(
                    f"compile worker {worker.proc.pid} died ({type(exc).__name__}: {exc}; exit "
                    f"code {worker.proc.poll()})" + (" twice" if attempt > 1 else ""),
                    engine=engine)
                if attempt > 1:
                    raise lost from exc
                log.warning("%s; retrying the compile on a new worker", lost)
                continue
            self._retire(worker)
            if self._closed:
                raise RuntimeClosed("the compile workers were stopped (runtime closed)")
            if self._on_kill is not None:
                self._on_kill()
            raise GrammarTimeout(
                f"compile exceeded its time limit of {timeout_s:g} s; worker killed after "
                f"{time.monotonic() - t0:.2f} s", engine=engine,
            )

    def _take(self, engine: str) -> _Worker:
        """An idle, live worker (a worker found dead while idle is replaced, not used)."""
        deadline = time.monotonic() + self._start_timeout_s
        while True:
            try:
                worker = self._idle.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                raise GrammarCompileError(
                    f"no compile worker became available in {self._start_timeout_s} s"
                    + (f" (last start error: {self.start_error})" if self.start_error else ""),
                    engine=engine,
                ) from None
            if worker is None or self._closed:
                self._idle.put(None)  # let every other waiter see it too
                raise RuntimeClosed("the compile workers were stopped (runtime closed)")
            if worker.proc.poll() is None:
                return worker
            log.warning("idle compile worker %s had exited (code %s); starting another",
                        worker.proc.pid, worker.proc.returncode)
            self._retire(worker)

    def _retire(self, worker: _Worker) -> None:
        with self._all_lock:
            self._all.discard(worker)
        worker.kill()
        self._spawn_async()
