"""Runtime metrics: counters and timing samples, readable as a plain dict."""

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


class Metrics:
    """Thread-safe counters and bounded timing windows.

    ``snapshot()`` returns a flat ``dict`` (counters plus p50/p99/mean of each timing in
    milliseconds), easy to export to Prometheus or logs.
    """

    #: Counters every runtime reports, even when zero.
    COUNTERS = (
        "compiles", "compile_errors", "compile_timeouts", "cache_hits_memory", "cache_hits_disk",
        "cache_hits_failure", "cache_misses", "inflight_dedup", "engine_fallbacks",
        "workers_killed", "requests", "requests_failed", "tokens_accepted", "tokens_rejected",
        "rollbacks", "fill_steps", "fill_rows", "forced_stops",
    )

    def __init__(self, window: int = 4096) -> None:
        self._lock = threading.Lock()
        self._counters: dict[str, int] = dict.fromkeys(self.COUNTERS, 0)
        self._timings: dict[str, deque[float]] = {}
        self._window = window

    def inc(self, name: str, n: int = 1) -> None:
        """Add ``n`` to counter ``name``."""
        with self._lock:
            self._counters[name] = self._counters.get(name, 0) + n

    def observe(self, name: str, seconds: float) -> None:
        """Record one timing sample (seconds) under ``name``."""
        with self._lock:
            window = self._timings.get(name)
            if window is None:
                window = self._timings[name] = deque(maxlen=self._window)
            window.append(seconds)

    def record_fill(self, rows: int, seconds: float) -> None:
        """One batch fill step (one lock round trip: this is on the decode hot path)."""
        with self._lock:
            c = self._counters
            c["fill_steps"] += 1
            c["fill_rows"] += rows
            window = self._timings.get("fill")
            if window is None:
                window = self._timings["fill"] = deque(maxlen=self._window)
            window.append(seconds)

    def snapshot(self) -> dict[str, Any]:
        """All counters and, per timing, ``<name>_ms_p50/_p99/_mean`` and ``_count``."""
        with self._lock:
            out: dict[str, Any] = dict(self._counters)
            timings = {k: list(v) for k, v in self._timings.items()}
        for name, values in sorted(timings.items()):
            out[f"{name}_count"] = len(values)
            out[f"{name}_ms_p50"] = _percentile(values, 50) * 1e3
            out[f"{name}_ms_p99"] = _percentile(values, 99) * 1e3
            out[f"{name}_ms_mean"] = (sum(values) / len(values) * 1e3) if values else 0.0
        return out
