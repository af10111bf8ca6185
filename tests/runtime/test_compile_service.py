"""The compile service: futures, dedup, caches (memory, failure, disk), engine fallback and
a time limit that kills the worker."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest
from runtime_helpers import cpu_seconds, process_gone, wait_gone

from portable_guided.harness.latency import nested_any_of
from portable_guided.runtime import (
    GrammarCompileError,
    GrammarRuntime,
    GrammarSpec,
    GrammarTimeout,
)
from portable_guided.runtime.cache import ByteLRUCache, FailureCache
from portable_guided.runtime.compile_service import CompileService


def test_byte_lru_cache_bounds():
    c: ByteLRUCache[str] = ByteLRUCache(100)
    c.put("a", "A", 40)
    c.put("b", "B", 40)
    assert c.get("a") == "A"  # a is now most recent
    c.put("c", "C", 40)  # evicts b (least recently used)
    assert c.get("b") is None and c.get("a") == "A" and c.get("c") == "C"
    assert c.nbytes == 80
    c.put("huge", "H", 101)  # larger than the budget: not stored
    assert c.get("huge") is None and c.nbytes == 80
    with pytest.raises(ValueError, match="max_bytes must be >= 0, got -1"):
        ByteLRUCache(-1)


def test_failure_cache_expires():
    f = FailureCache(ttl_s=0.05)
    f.put("k", ValueError("x"))
    assert isinstance(f.get("k"), ValueError)
    time.sleep(0.06)
    assert f.get("k") is None


def test_memory_cache_bounded_in_runtime(deepseek):
    with GrammarRuntime(deepseek, "xgrammar", compile_timeout_s=None, cache_bytes=60_000) as rt:
        sizes = []
        for i in range(4):
            sizes.append(rt.compile(GrammarSpec.regex(f"x{i}[a-z]{{2}}")).nbytes)
        m = rt.metrics()
        assert m["cache_bytes"] <= 60_000 and m["cache_entries"] < 4, (sizes, m)
        assert m["compiles"] == 4


def test_inflight_dedup_and_hits(deepseek):
    with GrammarRuntime(deepseek, "xgrammar", compile_timeout_s=None) as rt:
        spec = GrammarSpec.json_schema(nested_any_of(2))
        f1, f2 = rt.compile_async(spec), rt.compile_async(spec)
        assert f1 is f2
        f1.result(60)
        f3 = rt.compile_async(spec)
        assert f3.done() and f3.result() is f1.result()
        m = rt.metrics()
        assert (m["compiles"], m["inflight_dedup"], m["cache_hits_memory"]) == (1, 1, 1)


def test_failures_cached_with_reason(rt):
    spec = GrammarSpec.ebnf(f'root ::= "a" missing_{rt.engine}')
    with pytest.raises(GrammarCompileError, match=f"missing_{rt.engine}"):
        rt.compile(spec)
    before = rt.metrics()["cache_hits_failure"]
    req = rt.new_request(spec)
    assert req.ready and req.failed  # answered from the failure cache at once
    assert rt.metrics()["cache_hits_failure"] == before + 1


def test_auto_falls_back(deepseek):
    spec = GrammarSpec.json_schema({"type": "object",
                                    "propertyNames": {"type": "string", "maxLength": 3}})
    with GrammarRuntime(deepseek, "auto", compile_timeout_s=None) as rt:
        req = rt.new_request(spec).wait(60)  # llguidance: "Unimplemented keys: [\"propertyNames\"]"
        assert req.engine_name == "xgrammar" and rt.metrics()["engine_fallbacks"] == 1
        assert rt.new_request(GrammarSpec.regex("[ab]+")).wait(60).engine_name == "llguidance"
        both_fail = rt.new_request(GrammarSpec.ebnf('root ::= "a" nope')).wait(60)
        assert both_fail.failed and "every engine failed" in str(both_fail.error)
        assert "[xgrammar]" in str(both_fail.error) and "[llguidance]" in str(both_fail.error)


def test_disk_cache_shared_with_another_process(deepseek, tmp_path):
    schema = {"type": "object", "properties": {"id": {"type": "integer"},
              "name": {"type": "string", "maxLength": 20}}, "required": ["id"]}
    spec = GrammarSpec.json_schema(schema)
    with GrammarRuntime(deepseek, "xgrammar", compile_timeout_s=None,
                        disk_cache_dir=str(tmp_path)) as rt:
        first = rt.compile(spec)
        assert first.source == "local" and rt.metrics()["cache_hits_disk"] == 0
    files = list(tmp_path.rglob("*.grammar"))
    assert len(files) == 1
    script = textwrap.dedent(f"""
        import json, numpy as np
        from portable_guided.runtime import GrammarRuntime, GrammarSpec, load_tokenizer_info
        info = load_tokenizer_info("deepseek", vocab_size=129_344)
        rt = GrammarRuntime(info, "xgrammar", compile_timeout_s=None,
                            disk_cache_dir={str(tmp_path)!r})
        req = rt.new_request(GrammarSpec.json_schema({json.dumps(schema)!r})).wait(60)
        bm = rt.allocate_bitmask(1)
        req.accept_tokens(info.encode('{{"id": 5, "name'))
        rt.fill_bitmask([req], bm)
        np.save({str(tmp_path / "mask.npy")!r}, bm)
        m = rt.metrics()
        print(json.dumps({{"disk": m["cache_hits_disk"], "compiles": m["compiles"]}}))
    """)
    env = dict(os.environ, PYTHONPATH=os.getcwd())
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         env=env, timeout=300, check=False)
    assert out.returncode == 0, out.stderr[-2000:]
    assert json.loads(out.stdout.strip().splitlines()[-1]) == {"disk": 1, "compiles": 0}
    # The mask from the deserialized grammar equals the one compiled here.
    with GrammarRuntime(deepseek, "xgrammar", compile_timeout_s=None) as rt:
        req = rt.new_request(spec).wait(60)
        req.accept_tokens(deepseek.encode('{"id": 5, "name'))
        bm = rt.allocate_bitmask(1)
        rt.fill_bitmask([req], bm)
    assert np.array_equal(np.load(tmp_path / "mask.npy"), bm)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc for CPU time")
def test_pathological_spec_is_killed_while_others_decode(deepseek):
    limit = 2.0
    small = GrammarSpec.json_schema({"type": "object", "properties": {"a": {"type": "integer"}}})
    with GrammarRuntime(deepseek, "xgrammar", compile_timeout_s=limit) as rt:
        decoding = rt.new_request(small).wait(180)  # also waits for the worker to start
        assert not decoding.failed, decoding.error
        ids = deepseek.encode('{"a": 1234')
        bm = rt.allocate_bitmask(2)
        slow_spec = GrammarSpec.json_schema(nested_any_of(12))
        t0 = time.monotonic()
        slow = rt.new_request(slow_spec)
        while not rt.worker_pids(busy=True):
            time.sleep(0.005)
        (pid,) = rt.worker_pids(busy=True)
        steps, cpu_seen = 0, []
        while not slow.ready and time.monotonic() - t0 < 30:
            # The other request keeps decoding while the pathological one compiles.
            rt.fill_bitmask([decoding, slow], bm)
            assert decoding.accept_tokens(ids) == len(ids)
            decoding.rollback(len(ids))
            steps += 1
            if steps % 50 == 0:
                cpu = cpu_seconds(pid)
                if cpu is not None and not process_gone(pid):
                    cpu_seen.append(cpu)
        elapsed = time.monotonic() - t0
        assert slow.failed and isinstance(slow.error, GrammarTimeout), slow.error
        assert elapsed <= 1.5 * limit, elapsed
        assert steps > 20
        assert len(cpu_seen) >= 2 and cpu_seen[-1] > cpu_seen[0]  # the worker was busy...
        assert wait_gone(pid)  # ...and is gone: its CPU time stopped
        m = rt.metrics()
        assert m["compile_timeouts"] == 1 and m["workers_killed"] == 1
        # A replacement worker serves the next compile; the timed-out spec fails fast.
        again = rt.new_request(slow_spec)
        assert again.ready and again.failed
        other = rt.new_request(GrammarSpec.regex("[0-9]+")).wait(180)
        assert not other.failed and pid not in rt.worker_pids()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc for CPU time")
def test_worker_dies_with_its_parent(tmp_path):
    # An engine process killed mid-compile must not leave its worker burning CPU.
    script = textwrap.dedent("""
        import sys, time
        sys.path.insert(0, "tests/runtime")
        from test_compile_service import nested_any_of
        from portable_guided.runtime import GrammarRuntime, GrammarSpec, load_tokenizer_info
        rt = GrammarRuntime(load_tokenizer_info("deepseek"), "xgrammar", compile_timeout_s=600)
        rt.compile(GrammarSpec.regex("a"), timeout=300)
        spec = GrammarSpec.json_schema(nested_any_of(10), validate=False)
        rt.compile_async(spec)
        while not rt.worker_pids(busy=True):
            time.sleep(0.01)
        print(rt.worker_pids(busy=True)[0], flush=True)
        time.sleep(600)
    """)
    env = dict(os.environ, PYTHONPATH=os.getcwd())
    parent = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True,
                              env=env)
    try:
        worker_pid = int(parent.stdout.readline())
        start = cpu_seconds(worker_pid)
        time.sleep(1.0)
        assert not process_gone(worker_pid) and cpu_seconds(worker_pid) > start  # compiling
    finally:
        parent.kill()
        parent.wait()
    deadline = time.monotonic() + 10
    while not process_gone(worker_pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert process_gone(worker_pid)


def test_every_engine_compiles_under_the_limit_in_a_worker(deepseek):
    """With a time limit every engine compiles in a worker (llguidance's own limits bound
    work, not time: issue 17, F6); its masks equal those of a runtime without a limit."""
    spec = GrammarSpec.json_schema({"type": "object", "properties": {"n": {"type": "integer"}},
                                    "required": ["n"]})
    with GrammarRuntime(deepseek, "llguidance", compile_timeout_s=30.0) as limited, \
            GrammarRuntime(deepseek, "llguidance", compile_timeout_s=None) as free:
        limited.compile(spec, timeout=120)
        assert limited.worker_pids() and free.worker_pids() == []
        assert limited.metrics()["compile_wait_count"] == 1  # went through a worker
        masks = []
        for rt in (limited, free):
            req = rt.new_request(spec).wait(60)
            req.accept_tokens(deepseek.encode('{"n": 1'))
            bm = rt.allocate_bitmask(1)
            rt.fill_bitmask([req], bm)
            masks.append(bm)
        assert np.array_equal(*masks)
    with GrammarRuntime(deepseek, "auto", compile_timeout_s=5.0) as rt:
        assert set(rt._service._worker_engines()) == {"xgrammar", "llguidance"}


def test_race_compiles_once_here_with_the_worker_path_masks(deepseek):
    """``compile_race``: the grammar comes from this process's compile (no second compile,
    nothing shipped) and gives the masks the worker path gives."""
    spec = GrammarSpec.json_schema({"type": "object", "properties": {
        "n": {"type": "integer"}, "s": {"type": "string"}}, "required": ["n", "s"]})
    prefix = deepseek.encode('{"n": 12, "s": "ab')
    masks = []
    with GrammarRuntime(deepseek, "xgrammar", compile_timeout_s=30.0,
                        compile_race=True) as raced, \
            GrammarRuntime(deepseek, "xgrammar", compile_timeout_s=30.0) as plain:
        compiled = raced.compile(spec)
        assert compiled.source == "race"
        m = raced.metrics()
        assert m["races_won_here"] == 1 and m["race_runaways"] == 0
        assert m["compile_wait_count"] == 0  # no worker compiled it
        assert plain.compile(spec).source != "race"
        for rt in (raced, plain):
            req = rt.new_request(spec).wait(120)
            assert req.accept_tokens(prefix) == len(prefix)
            bm = rt.allocate_bitmask(1)
            rt.fill_bitmask([req], bm)
            masks.append(bm)
    assert np.array_equal(*masks)
    assert 0 < np.unpackbits(masks[0].view(np.uint8)).sum() < deepseek.vocab_size


def test_race_sends_a_spec_too_large_to_compile_here_to_a_worker(deepseek):
    """A spec past LOCAL_MAX_CHARS (building and parsing its grammar would hold this process's
    GIL) compiles in a worker even with ``race=True``."""
    from portable_guided.runtime.compile_service import LOCAL_MAX_CHARS

    schema = {"type": "integer", "description": "x" * LOCAL_MAX_CHARS}
    service = CompileService(deepseek, engine="xgrammar", timeout_s=30.0, race=True)
    try:
        compiled = service.submit(GrammarSpec.json_schema(schema)).result(120)
        counters = service.metrics.snapshot()
        assert compiled.source != "race"
        assert counters["races_won_here"] == 0 and counters["race_lane_full"] == 1
        assert counters["compile_wait_count"] == 1  # a worker compiled it
    finally:
        service.close()


def test_race_local_patience_must_be_a_duration(deepseek):
    with pytest.raises(ValueError, match="patience_s must be >= 0 seconds, got -1"):
        CompileService(deepseek, engine="xgrammar", timeout_s=None, local_patience_s=-1)


RACE_TIME_LIMIT_SCRIPT = textwrap.dedent('''
    import json, os, sys, time
    sys.path.insert(0, {tests!r})
    from portable_guided.runtime import GrammarRuntime, GrammarSpec, GrammarTimeout
    from portable_guided.runtime import load_tokenizer_info

    info = load_tokenizer_info("deepseek", vocab_size=129_344)
    rt = GrammarRuntime(info, "xgrammar", compile_timeout_s={limit}, compile_race=True)
    rt.compile(GrammarSpec.regex("[0-9]+"))  # compiled here: the worker may still be starting
    while not rt.worker_pids():  # the compile after the runaway needs it
        time.sleep(0.05)
    t0 = time.monotonic()
    try:
        # A few hundred characters, many seconds of xgrammar (eight long length bounds): small
        # enough to compile here (LOCAL_MAX_CHARS).
        rt.compile(GrammarSpec.json_schema({{"type": "object", "properties": {{
            f"p{{i}}": {{"type": "string", "maxLength": 32767 - i}} for i in range(8)}}}}))
        outcome = "compiled"
    except GrammarTimeout:
        outcome = "timeout"
    elapsed = time.monotonic() - t0
    runaway = rt._service.runaway is not None
    # While the runaway compile runs here, a new compile goes through the worker alone.
    after = rt.compile(GrammarSpec.regex("[a-z]+")).source
    print(json.dumps(dict(outcome=outcome, elapsed=elapsed, runaway=runaway, after=after,
                          metrics=rt.metrics())), flush=True)
    os._exit(0)  # the runaway compile ends with the process
''')


def test_race_keeps_the_time_limit_and_pauses_while_a_compile_runs_away(tmp_path):
    limit = 2.0
    script = RACE_TIME_LIMIT_SCRIPT.format(tests=os.path.dirname(__file__), limit=limit)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=280, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["outcome"] == "timeout"
    assert result["elapsed"] <= 1.5 * limit, result["elapsed"]
    assert result["runaway"] is True
    assert result["after"] in ("local", "compile")  # not "race": races are paused
    m = result["metrics"]
    assert m["race_runaways"] == 1 and m["compile_timeouts"] == 1
    assert m["workers_killed"] == 0  # compiled here: no worker was involved


def test_warm_builds_every_engine_of_the_order(deepseek):
    """``GrammarRuntime.warm``: this process's engines built (each tokenizer converted)
    before the first compile, for every engine ``auto`` may use (an upgrade's too), and the
    first compile then uses them as they are."""
    from portable_guided.runtime import GrammarRuntime, GrammarSpec

    with GrammarRuntime(deepseek, "auto", compile_timeout_s=5) as rt:
        rt.warm()
        built = dict(rt._service._engines)
        assert set(built) == {"llguidance", "xgrammar"}
        rt.compile(GrammarSpec.json_schema({"type": "integer"}))
        assert rt._service._engines == built  # nothing built again
    with GrammarRuntime(deepseek, "xgrammar", compile_timeout_s=5) as rt:
        rt.warm()
        assert set(rt._service._engines) == {"xgrammar"}
