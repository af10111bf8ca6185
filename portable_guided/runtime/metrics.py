"""Runtime metrics: counters and timings, readable as a plain dict.

Counters and each timing's count and sum are monotonic totals since the runtime started (what
a monitoring system needs: rates survive any scrape interval); percentiles and means come from
a bounded window of the latest samples. :mod:`portable_guided.runtime.prometheus` exports both.
"""

from __future__ import annotations

import threading
from collections import deque
from typing import Any

__all__ = ["Metrics"]


def _percentile(values: list[float], q: float) -> float:
    if not values:
        return 0.0
    values = sorted(values)
    k = min(len(values) - 1, max(0, round(q / 100.0 * (len(values) - 1))))
    return values[k]


class _Timing:
    """One timing: monotonic count and sum, plus a window of the latest samples."""

    __slots__ = ("count", "total_s", "window")

    def __init__(self, window: int) -> None:
        self.count = 0
        self.total_s = 0.0
        self.window: deque[float] = deque(maxlen=window)

    def add(self, seconds: float) -> None:
        self.count += 1
        self.total_s += seconds
        self.window.append(seconds)


class Metrics:
    """Thread-safe counters and timings.

    ``snapshot()`` returns a flat ``dict``: every counter, and per timing ``<name>_count`` and
    ``<name>_seconds_total`` (monotonic totals) plus ``<name>_ms_p50/_ms_p99/_ms_mean`` over
    the last ``window`` samples (``<name>_window`` of them).

    >>> m = Metrics(window=2)
    >>> for s in (1.0, 2.0, 3.0):
    ...     m.observe("compile", s)
    >>> snap = m.snapshot()
    >>> snap["compile_count"], snap["compile_seconds_total"], snap["compile_window"]
    (3, 6.0, 2)
    """

    #: Counters every runtime reports, even when zero.
    COUNTERS = (
        "compiles", "compile_errors", "compile_timeouts", "cache_hits_memory", "cache_hits_disk",
        "cache_hits_failure", "cache_misses", "inflight_dedup", "engine_fallbacks",
        "workers_killed", "requests", "requests_failed", "tokens_accepted", "tokens_rejected",
        "rollbacks", "fill_steps", "fill_rows", "forced_stops", "races_won_here",
        "race_runaways", "race_lane_full", "cache_entries_rejected", "cache_problems",
        "cache_hits_shared_failure", "upgrades", "upgrade_failures", "upgrades_dropped",
        "handovers", "handovers_failed", "prewarm_compiled", "prewarm_failed",
    )
    #: Timings every runtime reports, even before their first sample.
    TIMINGS = ("compile", "compile_wait", "fill")

    def __init__(self, window: int = 4096) -> None:
        if isinstance(window, bool) or not isinstance(window, int) or window < 1:
            raise ValueError(f"window must be an int >= 1, got {window!r}")
        self._lock = threading.Lock()
        self._counters: dict[str, int] = dict.fromkeys(self.COUNTERS, 0)
        self._window = window
        self._timings: dict[str, _Timing] = {n: _Timing(window) for n in self.TIMINGS}
        self._fill = self._timings["fill"]

    def inc(self, name: str, n: int = 1) -> None:
        """Add ``n`` to counter ``name``."""
        with self._lock:
            self._counters[name] = self._counters.get(name, 0) + n

    def observe(self, name: str, seconds: float) -> None:
        """Record one timing sample (seconds) under ``name``."""
        with self._lock:
            timing = self._timings.get(name)
            if timing is None:
                timing = self._timings[name] = _Timing(self._window)
            timing.add(seconds)

    def record_fill(self, rows: int, seconds: float) -> None:
        """One batch fill step (one lock round trip: this is on the decode hot path)."""
        with self._lock:
            c = self._counters
            c["fill_steps"] += 1
            c["fill_rows"] += rows
            self._fill.add(seconds)

    def snapshot(self) -> dict[str, Any]:
        """All counters and, per timing, ``<name>_count``, ``<name>_seconds_total``,
        ``<name>_window`` and ``<name>_ms_p50/_ms_p99/_ms_mean`` (over the window)."""
        with self._lock:
            out: dict[str, Any] = dict(self._counters)
            timings = {k: (t.count, t.total_s, list(t.window)) for k, t in self._timings.items()}
        for name, (count, total_s, values) in sorted(timings.items()):
            out[f"{name}_count"] = count
            out[f"{name}_seconds_total"] = total_s
            out[f"{name}_window"] = len(values)
            out[f"{name}_ms_p50"] = _percentile(values, 50) * 1e3
            out[f"{name}_ms_p99"] = _percentile(values, 99) * 1e3
            out[f"{name}_ms_mean"] = (sum(values) / len(values) * 1e3) if values else 0.0
        return out

    def timing_names(self) -> list[str]:
        """Names of the timings recorded so far (always including :attr:`TIMINGS`)."""
        with self._lock:
            return sorted(self._timings)
