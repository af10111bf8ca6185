"""FillPool: rows filled on several threads equal single fills; order, errors, shutdown."""

from __future__ import annotations

import threading

import numpy as np
import pytest
from test_batch import _requests

from portable_guided.runtime import GrammarRuntime
from portable_guided.runtime.fill_pool import FillPool


class _Recording:
    """Stands in for a matcher (the pool only calls ``fill``): records when it was filled,
    can wait on a barrier or fail."""

    def __init__(self, log: list[int], ident: int, barrier: threading.Barrier | None = None,
                 error: Exception | None = None) -> None:
        self.log, self.ident, self.barrier, self.error = log, ident, barrier, error

    def fill(self, bitmask, row):
        self.log.append(self.ident)
        if self.barrier is not None:
            self.barrier.wait(timeout=10)
        if self.error is not None:
            raise self.error
        bitmask[row] = self.ident


@pytest.fixture
def pool():
    made = FillPool(2)
    yield made
    made.close()


def _matcher(rt, req):
    """The matcher a batch fill would use for ``req`` (an active request past its first
    token: the first mask is a copy, written by ``fill_target``)."""
    scratch = rt.allocate_bitmask(1)
    with req.fill_lock:
        matcher = req.fill_target(scratch, 0)
    assert matcher is not None, "request not active, or at its grammar's start"
    return matcher


def test_rows_equal_single_fills_in_any_order(rt, pool):
    reqs = _requests(rt, 16)
    expected = np.zeros((16, rt.bitmask_words), dtype=np.int32)
    for row, req in enumerate(reqs):
        req.fill(expected, row)
    rows = np.random.default_rng(0).permutation(16)
    got = np.zeros_like(expected)
    costs = pool.run([(_matcher(rt, req), int(row)) for req, row in zip(reqs, rows)], got)
    assert np.array_equal(got[rows], expected)
    assert len(costs) == 16 and all(c > 0 for c in costs)


def test_two_jobs_run_at_the_same_time(pool):
    # Each job waits for the other at a barrier: this only finishes if both threads fill.
    barrier, log = threading.Barrier(2), []
    bm = np.zeros((2, 1), dtype=np.int32)
    pool.run([(_Recording(log, 7, barrier), 0), (_Recording(log, 9, barrier), 1)], bm)
    assert bm[:, 0].tolist() == [7, 9] and sorted(log) == [7, 9]


def test_jobs_start_in_the_given_order(pool):
    log: list[int] = []
    bm = np.zeros((6, 1), dtype=np.int32)
    pool.run([(_Recording(log, i), i) for i in range(6)], bm)
    assert sorted(log[:2]) == [0, 1] and sorted(log) == list(range(6))
    assert bm[:, 0].tolist() == list(range(6))


def test_an_error_is_raised_after_the_other_rows_are_filled(pool):
    log: list[int] = []
    bm = np.zeros((4, 1), dtype=np.int32)
    jobs = [(_Recording(log, 1), 0), (_Recording(log, 2, error=ValueError("row 1 broke")), 1),
            (_Recording(log, 3), 2), (_Recording(log, 4), 3)]
    with pytest.raises(ValueError, match="row 1 broke"):
        pool.run(jobs, bm)
    assert bm[:, 0].tolist() == [1, 0, 3, 4]
    pool.run([(_Recording(log, 5), 1)], bm)  # still usable
    assert bm[1, 0] == 5


def test_close_stops_the_helpers_and_later_runs_fail():
    made = FillPool(3)
    helpers = list(made._helpers)
    made.close()
    made.close()  # idempotent
    for helper in helpers:
        helper.join(timeout=5)
        assert not helper.is_alive()
    with pytest.raises(RuntimeError, match="closed"):
        made.run([], np.zeros((1, 1), dtype=np.int32))
    with pytest.raises(ValueError, match="threads >= 2, got 1"):
        FillPool(1)


@pytest.mark.parametrize("engine", ["xgrammar", "llguidance"])
def test_runtime_orders_each_batch_longest_first_by_last_cost(deepseek, monkeypatch, engine):
    pooled: list[list[int]] = []
    batched: list[list[int]] = []
    real_run = FillPool.run

    def spy_run(self, jobs, bitmask):
        pooled.append([row for _, row in jobs])
        return real_run(self, jobs, bitmask)

    monkeypatch.setattr(FillPool, "run", spy_run)
    with GrammarRuntime(deepseek, engine, compile_timeout_s=None, fill_threads=2,
                        parallel_fill_min_us=0.0) as rt:
        reqs = _requests(rt, 8)
        cls = type(reqs[0].engine)
        real_fill_batch = cls.fill_batch

        def spy_fill_batch(self, matchers, bitmask, rows):
            batched.append(list(rows))
            return real_fill_batch(self, matchers, bitmask, rows)

        monkeypatch.setattr(cls, "fill_batch", spy_fill_batch)
        fake_costs = [0.3, 0.1, 0.8, 0.2, 0.7, 0.5, 0.4, 0.6]
        fake_order = sorted(range(8), key=lambda i: -fake_costs[i])
        for req, cost in zip(reqs, fake_costs):
            req.fill_cost_s = cost
        bm = rt.allocate_bitmask(8)
        expected = np.zeros_like(bm)
        for row, req in enumerate(reqs):
            req.fill(expected, row)

        rt._row_cost = 1e-6  # cheap rows: the engine's batch call, in the same order
        rt.fill_bitmask(reqs, bm)
        assert batched == [fake_order] and pooled == [] and np.array_equal(bm, expected)

        rt._row_cost = 1.0  # costly rows: our pool, which times each row
        bm[:] = 0
        rt.fill_bitmask(reqs, bm)
        assert pooled == [fake_order] and np.array_equal(bm, expected)
        measured = [req.fill_cost_s for req in reqs]
        assert all(0 < c < 0.1 for c in measured)  # replaced by the real times
        rt.fill_bitmask(reqs, bm)
        assert pooled[-1] == sorted(range(8), key=lambda i: -measured[i])
