"""Fill bitmask rows on several threads, longest mask first.

A batch's time on two threads is bounded by its most expensive mask: when one mask costs as
much as the rest together and is started last, the other thread sits idle. Engines' own
batch calls hand rows out in the order given and cannot report what each row cost, so they
cannot order a batch. :class:`FillPool` times every row and the runtime feeds those times
back as the next step's order (longest first, the LPT rule), because a request's mask cost
changes slowly from one token to the next.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Sequence
from typing import Any

from .engines import Matcher

__all__ = ["FillPool"]


class FillPool:
    """The calling thread plus ``threads - 1`` helper threads, filling rows from one list.

    Each thread takes the next job when it finishes one, so a few expensive rows never
    strand the cheap ones behind them. Only for matchers whose ``fill`` releases the GIL
    (xgrammar's does); one :meth:`run` at a time (others wait).
    """

    def __init__(self, threads: int) -> None:
        if not isinstance(threads, int) or threads < 2:
            raise ValueError(f"a FillPool needs threads >= 2, got {threads!r}")
        self.threads = threads
        self._run_lock = threading.Lock()
        self._start = threading.Semaphore(0)
        self._finished = threading.Semaphore(0)
        self._jobs: Sequence[tuple[Matcher, int]] = ()
        self._costs: list[float] = []
        self._bitmask: Any = None
        self._next: Any = None
        self._errors: list[BaseException] = []
        self._closed = False
        self._helpers = [
            threading.Thread(target=self._helper, name=f"pg-fill-{i}", daemon=True)
            for i in range(threads - 1)
        ]
        for helper in self._helpers:
            helper.start()

    def run(self, jobs: Sequence[tuple[Matcher, int]], bitmask: Any) -> list[float]:
        """Fill ``bitmask[row]`` from each ``(matcher, row)``; returns each job's seconds.

        Jobs start in the order given. The first error raised by a matcher is re-raised
        after every thread has stopped (the rows of the other jobs are still filled).
        """
        with self._run_lock:
            if self._closed:
                raise RuntimeError("the FillPool is closed")
            self._jobs, self._bitmask = jobs, bitmask
            self._costs = [0.0] * len(jobs)
            self._next = itertools.count()
            self._errors = []
            helpers = min(len(self._helpers), max(len(jobs) - 1, 0))
            for _ in range(helpers):
                self._start.release()
            self._drain()
            for _ in range(helpers):
                self._finished.acquire()
            costs, errors = self._costs, self._errors
            self._jobs, self._bitmask = (), None
            if errors:
                raise errors[0]
            return costs

    def close(self) -> None:
        """Stop the helper threads (idempotent)."""
        with self._run_lock:
            if self._closed:
                return
            self._closed = True
            for _ in self._helpers:
                self._start.release()

    def _drain(self) -> None:
        jobs, costs, bitmask, counter = self._jobs, self._costs, self._bitmask, self._next
        perf = time.perf_counter
        n = len(jobs)
        for k in counter:  # itertools.count is atomic under the GIL: no job runs twice
            if k >= n:
                return
            matcher, row = jobs[k]
            t0 = perf()
            try:
                matcher.fill(bitmask, row)
            except BaseException as exc:  # noqa: BLE001 - re-raised by run()
                self._errors.append(exc)
            costs[k] = perf() - t0

    def _helper(self) -> None:
        while True:
            self._start.acquire()
            if self._closed:
                return
            self._drain()
            self._finished.release()
