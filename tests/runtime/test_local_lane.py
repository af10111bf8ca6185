"""LocalLane: bounded slots for compiles in this process, smallest spec first, never stuck
behind a long compile."""

from __future__ import annotations

import threading
import time

import pytest

from portable_guided.runtime.local_lane import LocalLane


def enter_in_thread(lane: LocalLane, size: int, order: list[int], got: dict[int, int | None],
                    deadline: float | None = None) -> threading.Thread:
    def run() -> None:
        token = lane.enter(size, deadline)
        got[size] = token
        order.append(size)
        if token is not None:
            lane.leave(token)

    thread = threading.Thread(target=run)
    thread.start()
    return thread


def wait_waiting(lane: LocalLane, n: int) -> None:
    end = time.monotonic() + 10
    while len(lane._waiting) < n:  # the waiters have queued
        if time.monotonic() > end:
            raise AssertionError(f"{len(lane._waiting)} waiters, expected {n}")
        time.sleep(0.001)


def test_waiters_are_served_smallest_spec_first():
    lane = LocalLane(slots=1, patience_s=30.0)
    holder = lane.enter(100, None)
    order: list[int] = []
    got: dict[int, int | None] = {}
    threads = [enter_in_thread(lane, size, order, got) for size in (50, 7, 30, 9)]
    wait_waiting(lane, 4)
    lane.leave(holder)
    for thread in threads:
        thread.join(10)
    assert order == [7, 9, 30, 50]
    assert all(token is not None for token in got.values())


def test_a_large_spec_that_waited_goes_before_a_new_small_one():
    lane = LocalLane(slots=1, patience_s=30.0, age_s=0.05)
    holder = lane.enter(1, None)
    order: list[int] = []
    got: dict[int, int | None] = {}
    big = enter_in_thread(lane, 1000, order, got)
    wait_waiting(lane, 1)
    time.sleep(1.0)  # 1000 / (1 + 20) < 100
    small = enter_in_thread(lane, 100, order, got)
    wait_waiting(lane, 2)
    lane.leave(holder)
    big.join(10)
    small.join(10)
    assert order == [1000, 100]


def test_a_long_compile_frees_its_slot_for_the_next_up_to_long_slots():
    lane = LocalLane(slots=1, patience_s=0.2, long_slots=1)
    lane.enter(1, None)  # never leaves
    t0 = time.monotonic()
    second = lane.enter(2, None)  # the first turns long at 0.2 s: a place for this one
    assert second is not None and 0.15 <= time.monotonic() - t0 < 2.0
    time.sleep(0.25)  # both long now, and long_slots=1 is taken: no place is coming
    t0 = time.monotonic()
    assert lane.enter(3, None) is None
    assert time.monotonic() - t0 < 0.1
    assert lane.running == 2


def test_without_long_slots_a_waiter_gives_up_when_the_holder_turns_long():
    lane = LocalLane(slots=1, patience_s=0.2, long_slots=0)
    lane.enter(1, None)
    t0 = time.monotonic()
    assert lane.enter(2, None) is None
    assert 0.15 <= time.monotonic() - t0 < 2.0


def test_deadline_ends_the_wait_and_slots_bound_the_running():
    lane = LocalLane(slots=2, patience_s=30.0)
    a, b = lane.enter(1, None), lane.enter(1, None)
    assert a is not None and b is not None and lane.running == 2
    t0 = time.monotonic()
    assert lane.enter(1, time.monotonic() + 0.2) is None
    assert 0.15 <= time.monotonic() - t0 < 2.0
    lane.leave(a)
    assert lane.running == 1
    assert lane.enter(1, time.monotonic() + 0.2) is not None


@pytest.mark.parametrize("slots, patience, message", [
    (0, 1.0, "slots must be an int >= 1, got 0"),
    (1, -0.5, "patience_s must be >= 0 seconds, got -0.5"),
    (1, 1.0, "age_s must be > 0 seconds, got 0"),
    (1, 1.0, "long_slots must be an int >= 0, got -1"),
])
def test_bad_arguments_name_their_values(slots, patience, message):
    with pytest.raises(ValueError, match=message):
        LocalLane(slots, patience, age_s=0 if "age_s" in message else 1.0,
                  long_slots=-1 if "long_slots" in message else 2)
