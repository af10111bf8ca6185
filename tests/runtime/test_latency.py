"""The latency a serving engine can promise (docs/latency.md, "Latency model"): a compile
resolves within its limit counted from submission on every engine, the compile after a kill
starts at once, and pathological specs do not hold up benign ones."""

from __future__ import annotations

import sys
import threading
import time
from pathlib import Path

import pytest

from portable_guided.harness import latency
from portable_guided.runtime import GrammarSpec, GrammarTimeout
from portable_guided.runtime.engines import engine_class
from portable_guided.runtime.worker import WorkerPool

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"),
                                reason="worker processes are killed and reniced (Linux)")

MASKBENCH = Path(__file__).resolve().parents[2].parent / "shared/data/maskbench/Github_easy.jsonl"
if not MASKBENCH.exists():
    MASKBENCH = Path("/work/shared/data/maskbench/Github_easy.jsonl")


@pytest.mark.parametrize("engine", ["xgrammar", "llguidance", "auto"])
def test_every_engine_resolves_within_its_limit_from_submission(deepseek, engine):
    """Before: 2.1-2.4 s on llguidance, 2.1 then 3.8 s on xgrammar (the replacement worker's
    start) and 6.0-8.3 s under auto (a full limit per engine) for a 2 s limit."""
    limit = 1.0
    rt = latency.warm_runtime(deepseek, engine, limit)
    try:
        result = latency.measure_deadline(rt, repeats=2)
    finally:
        rt.close()
    assert result.errors == ["GrammarTimeout"] * 2, result
    # The target (1.25x + 0.2 s) is measured in bench/bench_latency.py; here, slack for a
    # loaded CI machine that still tells a shared budget from one limit per engine.
    assert max(result.resolved_s) <= 1.25 * limit + 0.75, result.resolved_s
    # The next compile does not wait for a replacement worker (before: 1.5-4 s). The
    # 50 ms target is measured in bench/bench_latency.py; CI machines are noisy.
    assert max(result.next_compile_s) < 0.5, result.next_compile_s


def test_a_job_that_waits_its_whole_limit_never_starts(deepseek):
    """With no long lane and no spare, a compile queued behind a pathological one fails at
    its own deadline (counted from submission) without ever reaching a worker."""
    payload = engine_class("xgrammar").tokenizer_payload(deepseek)
    pool = WorkerPool(lambda: {"xgrammar": payload}, size=1, spares=0, max_long=0)
    try:
        pool.run("xgrammar", GrammarSpec.regex("a+").to_dict(), 120.0)  # started
        outcomes: dict[str, object] = {}
        done = threading.Event()

        def record(name):
            def store(outcome):
                outcomes[name] = (outcome, time.monotonic())
                if len(outcomes) == 2:
                    done.set()
            return store

        t0 = time.monotonic()
        pool.submit("xgrammar", latency.pathological_spec().to_dict(), 1.5, "auto",
                    record("slow"))
        pool.submit("xgrammar", GrammarSpec.regex("b+").to_dict(), 0.5, "auto",
                    record("queued"))
        assert done.wait(30)
        queued, at = outcomes["queued"]
        assert isinstance(queued, GrammarTimeout) and not queued.started, queued
        assert "never started" in str(queued), queued
        assert 0.5 <= at - t0 <= 0.5 * 1.25 + 0.75, at - t0  # (slack: a loaded machine)
        slow, at = outcomes["slow"]
        assert isinstance(slow, GrammarTimeout) and at - t0 <= 1.5 * 1.25 + 0.75
    finally:
        pool.close()


@pytest.mark.skipif(not MASKBENCH.exists(), reason=f"MaskBench data not found at {MASKBENCH}")
def test_an_adversarial_burst_holds_up_no_benign_spec(deepseek):
    """8 pathological specs submitted first, then 16 benign MaskBench schemas, all at once:
    every benign one is ready within 2x its solo time + 0.5 s, every pathological one
    resolves within its deadline (before: the benign ones waited behind each pathological
    one's whole limit)."""
    schemas = latency.benign_schemas(MASKBENCH, 16)
    solo_rt = latency.warm_runtime(deepseek, "auto", 2.0)
    try:
        solo = latency.solo_seconds(solo_rt, schemas, "solo")
    finally:
        solo_rt.close()
    rt = latency.warm_runtime(deepseek, "auto", 2.0)
    try:
        result = latency.measure_burst(rt, schemas, solo, pathological=8)
    finally:
        rt.close()
    assert result.benign_failed == 0, result.as_dict()
    assert result.benign_over_target() == [], result.as_dict()
    assert result.pathological_outcomes == ["GrammarTimeout"] * 8, result.as_dict()
    assert result.pathological_over_deadline() == [], result.as_dict()
