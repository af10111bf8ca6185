"""DeadlineWatch: callbacks at their deadlines, in deadline order, unless cancelled."""

from __future__ import annotations

import threading
import time

from portable_guided.runtime.deadlines import DeadlineWatch


def test_callbacks_run_in_deadline_order_at_their_deadline():
    watch = DeadlineWatch()
    fired: list[tuple[str, float]] = []
    done = threading.Event()
    t0 = time.monotonic()
    watch.add(t0 + 0.30, lambda: (fired.append(("late", time.monotonic() - t0)), done.set()))
    watch.add(t0 + 0.10, lambda: fired.append(("early", time.monotonic() - t0)))
    assert done.wait(10)
    assert [name for name, _ in fired] == ["early", "late"]
    assert 0.10 <= fired[0][1] < 1.0 and 0.30 <= fired[1][1] < 1.5


def test_a_cancelled_callback_never_runs_and_a_failing_one_stops_nothing():
    watch = DeadlineWatch()
    fired: list[str] = []
    done = threading.Event()
    now = time.monotonic()
    handle = watch.add(now + 0.05, lambda: fired.append("cancelled"))

    def broken() -> None:
        raise RuntimeError("a bug in one callback")

    watch.add(now + 0.06, broken)
    watch.add(now + 0.10, lambda: (fired.append("after"), done.set()))
    watch.cancel(handle)
    watch.cancel(handle)  # twice: nothing
    assert done.wait(10)
    assert fired == ["after"]
