"""One thread that calls back at deadlines: a compile running in the caller's own thread
(``compile_race``) is failed at its deadline without a second thread per compile.

Registering and cancelling never wait for the watcher thread, so a compile that ends in
time costs no hand-over of the GIL to it (each costs up to the interpreter's switch
interval, 5 ms, against a busy engine loop: bench/bench_compile_gil.py).

>>> import time, threading
>>> fired = threading.Event()
>>> watch = DeadlineWatch()
>>> handle = watch.add(time.monotonic() + 0.05, fired.set)
>>> fired.wait(5)
True
>>> watch.cancel(watch.add(time.monotonic() + 0.05, lambda: print("never")))
>>> time.sleep(0.1)
"""

from __future__ import annotations

import heapq
import itertools
import logging
import threading
import time
from collections.abc import Callable

__all__ = ["DeadlineWatch"]

log = logging.getLogger(__name__)


class DeadlineWatch:
    """Calls each registered callback once at its deadline (``time.monotonic()``) unless it
    was cancelled first. The thread starts with the first deadline; callbacks run on it and
    must be quick."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._heap: list[tuple[float, int]] = []  # (deadline, handle)
        self._pending: dict[int, Callable[[], None]] = {}  # handle -> callback, until run
        self._serials = itertools.count()
        self._thread: threading.Thread | None = None

    def add(self, deadline: float, callback: Callable[[], None]) -> int:
        """Call ``callback`` at ``deadline``; returns a handle for :meth:`cancel`."""
        serial = next(self._serials)
        with self._cond:
            heapq.heappush(self._heap, (deadline, serial))
            self._pending[serial] = callback
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="pg-deadlines",
                                                daemon=True)
                self._thread.start()
            elif self._heap[0][1] == serial:
                self._cond.notify()  # the new deadline comes first
        return serial

    def cancel(self, handle: int) -> None:
        """Forget the callback of ``handle`` (nothing if it already ran)."""
        with self._cond:
            self._pending.pop(handle, None)

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._heap or self._heap[0][0] > time.monotonic():
                    timeout = self._heap[0][0] - time.monotonic() if self._heap else None
                    self._cond.wait(timeout)
                _, serial = heapq.heappop(self._heap)
                callback = self._pending.pop(serial, None)
                if callback is None:  # cancelled
                    continue
            try:
                callback()
            except Exception:  # one callback's bug must not stop the others
                log.exception("a deadline callback failed")
