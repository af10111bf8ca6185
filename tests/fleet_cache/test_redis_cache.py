"""The fleet cache against a real Redis server (issue 38): replicas (processes with runtimes
of their own, each with its own local directory, as hosts would be) compile each new schema
once between them; a schema that times out in one fails at once in the others; forged
entries and failure records are rejected; a killed compiler's lock expires; Redis killed or
paused mid-run degrades to the local cache within a bounded wait, failing no request."""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest
from fleet_helpers import SECRET, RedisServer

from portable_guided.harness.latency import pathological_spec
from portable_guided.runtime import (
    GrammarRuntime,
    GrammarSpec,
    GrammarTimeout,
    load_tokenizer_info,
)
from portable_guided.runtime.cache import DiskCache, pack_entry
from portable_guided.runtime.cache_setup import open_cache
from portable_guided.runtime.redis_cache import RedisCache
from tests.runtime.runtime_helpers import first_mask

REPO = Path(__file__).resolve().parents[2]
ENGINE = "llguidance"  # no torch in this lane: xgrammar needs it
OBJECT = GrammarSpec.json_schema({"type": "object"})
ARRAY = GrammarSpec.json_schema({"type": "array"})




@pytest.fixture(scope="module")
def info():
    return load_tokenizer_info("qwen")



def _warm(rt: GrammarRuntime) -> None:
    """Until the runtime's compile worker answers (with a short limit, a compile sent while
    the worker still starts fails with a time-out: each try is a new spec)."""
    deadline = time.monotonic() + 60
    for i in range(10_000):
        if not rt.new_request(GrammarSpec.regex(f"warm{i}[ab]+")).wait(60).failed:
            return
        assert time.monotonic() < deadline, "the compile worker never answered"
        time.sleep(0.1)


def _entry_key(rt: GrammarRuntime, info, spec: GrammarSpec) -> str:
    from portable_guided.runtime.compile_service import RUNTIME_CACHE_VERSION

    return DiskCache.make_key(engine=ENGINE, engine_version=rt._service.engine(ENGINE).version(),
                              runtime=RUNTIME_CACHE_VERSION, tokenizer=info.fingerprint,
                              spec=spec.key)


_REPLICA = textwrap.dedent("""
    import json, os, sys, time
    from portable_guided.runtime import GrammarRuntime, GrammarSpec, load_tokenizer_info
    folder, me, n, schemas = sys.argv[1], sys.argv[2], int(sys.argv[3]), json.loads(sys.argv[4])
    info = load_tokenizer_info("qwen")
    rt = GrammarRuntime(info, "llguidance", compile_timeout_s=30,
                        disk_cache_dir=os.path.join(folder, "host-" + me))
    rt.compile(GrammarSpec.regex("[ab]+" + me))  # workers and engine up before the start
    open(os.path.join(folder, "ready-" + me), "w").close()
    while len([f for f in os.listdir(folder) if f.startswith("ready-")]) < n:
        time.sleep(0.001)
    m0 = rt.metrics()
    sources = [rt.compile(GrammarSpec.json_schema(s)).source for s in schemas]
    m = rt.metrics()
    print(json.dumps({"sources": sources,
                      "compiles": m["compiles"] - m0["compiles"],
                      "disk": m["cache_hits_disk"] - m0["cache_hits_disk"]}))
    rt.close()
""")


def _schemas(n: int) -> list[dict]:
    return [{"type": "object", "properties": {
        f"p{j}": {"type": "string", "pattern": f"^[a-z]{{{j % 5 + 1},{j % 7 + 8}}}[0-9]+$"}
        for j in range(12 + i)}, "required": [f"p{i}"]} for i in range(n)]


def test_replicas_compile_each_new_schema_once(redis_url, tmp_path):
    """Three processes, each with its own runtime and local directory (three hosts), get
    the same four new schemas at once: four compiles in all, the rest loaded."""
    n, schemas = 3, _schemas(4)
    env = dict(os.environ, PYTHONPATH=str(REPO))
    procs = [subprocess.Popen([sys.executable, "-c", _REPLICA, str(tmp_path), str(i), str(n),
                               json.dumps(schemas)], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, env=env) for i in range(n)]
    results = []
    for proc in procs:
        out, err = proc.communicate(timeout=180)
        assert proc.returncode == 0, err[-3000:]
        results.append(json.loads(out.strip().splitlines()[-1]))
    assert sum(r["compiles"] for r in results) == len(schemas), results
    assert sum(r["disk"] for r in results) == (n - 1) * len(schemas), results
    for i in range(len(schemas)):
        column = sorted(r["sources"][i] for r in results)
        assert column.count("disk") == n - 1, results


def test_a_pathological_schema_times_out_once_for_the_fleet(redis_url, info, tmp_path):
    """Replica A spends its limit on a schema and times out; replica B, another runtime
    with another local directory, fails it at once with the same kind of error, compiling
    nothing and killing no worker."""
    slow = pathological_spec("fleet")  # seconds on every engine, far past the limit
    limit = 1.0
    with GrammarRuntime(info, ENGINE, compile_timeout_s=limit,
                        disk_cache_dir=str(tmp_path / "a")) as a, \
            GrammarRuntime(info, ENGINE, compile_timeout_s=limit,
                           disk_cache_dir=str(tmp_path / "b")) as b:
        for rt in (a, b):
            _warm(rt)
        t0 = time.monotonic()
        req = a.new_request(slow).wait(30)
        took_a = time.monotonic() - t0
        assert isinstance(req.error, GrammarTimeout), req.error
        assert limit * 0.9 <= took_a < limit + 1.0, took_a
        assert a.metrics()["workers_killed"] == 1
        m0 = b.metrics()
        t0 = time.monotonic()
        req = b.new_request(slow).wait(30)
        took_b = time.monotonic() - t0
        assert isinstance(req.error, GrammarTimeout), req.error
        assert "recorded by another process of the fleet" in str(req.error)
        assert took_b < 0.25 * limit, took_b
        m = b.metrics()
        assert m["cache_hits_shared_failure"] - m0.get("cache_hits_shared_failure", 0) == 1
        assert m["compiles"] == m0["compiles"] and m["workers_killed"] == 0


def test_forged_entry_in_redis_is_rejected_and_recompiled(redis_url, redis_server, info,
                                                           caplog):
    """The array grammar written into Redis under the object schema's key, with a header
    naming that key and the array entry's MAC (or one made with another secret): rejected,
    counted, removed, recompiled; the object's first tokens are the object's."""
    with GrammarRuntime(info, ENGINE, compile_timeout_s=None) as rt:
        rt.compile(ARRAY)
        rt.compile(OBJECT)
        expected = first_mask(rt, OBJECT)
        object_key, array_key = _entry_key(rt, info, OBJECT), _entry_key(rt, info, ARRAY)
    client = redis_server.client
    array_data = client.get(f"portable-guided:g:{array_key}")
    header, _, body = array_data.partition(b"\n")
    forgeries = [
        header.replace(array_key.encode(), object_key.encode()) + b"\n" + body,
        pack_entry(b"another-secret-0123456789", object_key, body.decode()),
    ]
    caplog.set_level(logging.WARNING, logger="portable_guided")
    for i, forged in enumerate(forgeries):
        client.set(f"portable-guided:g:{object_key}", forged)
        with GrammarRuntime(info, ENGINE, compile_timeout_s=None) as rt:
            assert rt.compile(OBJECT).source == "local"
            np.testing.assert_array_equal(first_mask(rt, OBJECT), expected)
            assert rt.metrics()["cache_entries_rejected"] == 1, i
        # Replaced by the recompiled, authentic entry.
        with GrammarRuntime(info, ENGINE, compile_timeout_s=None) as rt:
            assert rt.compile(OBJECT).source == "disk"
    assert len([r for r in caplog.records if "MAC does not verify" in r.getMessage()]) == 2


def test_forged_failure_record_is_ignored(redis_url, redis_server, info):
    """A failure record without the secret's MAC cannot fail a spec across the fleet."""
    with GrammarRuntime(info, ENGINE, compile_timeout_s=None) as rt:
        key = _entry_key(rt, info, OBJECT)
        redis_server.client.set(f"portable-guided:f:{key}",
                                b'{"type": "GrammarTimeout", "message": "forged"}')
        assert rt.compile(OBJECT).source == "local"
        assert rt.metrics()["cache_entries_rejected"] == 1
        assert redis_server.client.get(f"portable-guided:f:{key}") is None


def test_failure_record_replayed_after_its_ttl_is_ignored(redis_url, redis_server, info):
    """An authentic record copied back after it expired (its expiry is under the MAC) does
    not fail the spec again."""
    with GrammarRuntime(info, ENGINE, compile_timeout_s=None) as rt:
        key = _entry_key(rt, info, OBJECT)
        body = json.dumps({"type": "GrammarTimeout", "message": "old",
                           "until": time.time() - 1})
        redis_server.client.set(f"portable-guided:f:{key}",
                                pack_entry(SECRET.encode(), "f:" + key, body))
        assert rt.compile(OBJECT).source == "local"
        m = rt.metrics()
        assert m["cache_entries_rejected"] == 0 and m["cache_hits_shared_failure"] == 0


_HOLDER = textwrap.dedent("""
    import sys, time
    from portable_guided.runtime.redis_cache import RedisCache
    cache = RedisCache(sys.argv[1], secret=sys.argv[2], lock_ttl_s=float(sys.argv[3]))
    with cache.single_flight("k" * 64) as held:
        assert held
        print("held", flush=True)
        time.sleep(60)
""")


def test_the_lock_is_renewed_while_held_and_expires_when_its_holder_dies(redis_url):
    ttl = 0.6
    holder = subprocess.Popen([sys.executable, "-c", _HOLDER, redis_url, SECRET, str(ttl)],
                              stdout=subprocess.PIPE, text=True,
                              env=dict(os.environ, PYTHONPATH=str(REPO)))
    try:
        assert holder.stdout.readline().strip() == "held"
        cache = RedisCache(redis_url, lock_ttl_s=ttl)
        t0 = time.monotonic()
        with cache.single_flight("k" * 64, wait_s=3 * ttl) as held:  # renewed: not ours
            waited = time.monotonic() - t0
        assert held is False and 3 * ttl <= waited < 3 * ttl + 0.5, waited
        with cache.single_flight("j" * 64, wait_s=0.1) as held:
            assert held is True  # other keys are free
        holder.send_signal(signal.SIGKILL)  # dies holding the lock: no release
        holder.wait(10)
        t0 = time.monotonic()
        with cache.single_flight("k" * 64, wait_s=10) as held:
            waited = time.monotonic() - t0
            assert held is True
        assert waited <= ttl + 0.3, waited
        assert cache.problems == 0
    finally:
        holder.kill()
        holder.wait(10)


def test_release_is_token_checked(redis_url, redis_server):
    """A holder whose lock expired and was taken by another does not release the other's."""
    a = RedisCache(redis_url, lock_ttl_s=5)
    name = a.lock_name("k" * 64)
    with a.single_flight("k" * 64, wait_s=1) as held:
        assert held
        redis_server.client.set(name, b"someone-else")  # as if expired and retaken
    assert redis_server.client.get(name) == b"someone-else"


@pytest.mark.parametrize("outage", ["killed", "paused"])
def test_redis_gone_mid_run_degrades_to_the_local_cache(own_redis, info, tmp_path, caplog,
                                                        outage):
    """Redis killed (connections refused) or paused (no reply) between compiles: every
    request still compiles, each Redis call costing at most its timeout, and the local
    directory serves what it holds; one warning."""
    specs = [GrammarSpec.json_schema({"type": "object", "properties": {f"q{i}": {
        "type": "integer"}}}) for i in range(4)]
    cache = open_cache(str(tmp_path / "local"))
    assert isinstance(cache, RedisCache) and cache.timeout_s == 0.5
    caplog.set_level(logging.WARNING, logger="portable_guided")
    try:
        with GrammarRuntime(info, ENGINE, compile_timeout_s=10, disk_cache_dir=cache) as rt:
            assert not rt.new_request(specs[0]).wait(60).failed
            getattr(own_redis, "kill" if outage == "killed" else "pause")()
            t0 = time.monotonic()
            reqs = [rt.new_request(s).wait(30) for s in specs[1:]]
            took = time.monotonic() - t0
            assert [r.failed for r in reqs] == [False, False, False], [r.error for r in reqs]
            # One call to find Redis gone (at most connect + reply timeouts), then local.
            assert took < 2 * cache.timeout_s + 3.0, took
            assert not cache.available and cache.problems == 1
            m = rt.metrics()
            assert m["compiles"] == 4 and m["cache_problems"] == 1
        with GrammarRuntime(info, ENGINE, compile_timeout_s=None, disk_cache_dir=cache) as rt:
            assert [rt.compile(s).source for s in specs] == ["disk"] * 4  # the local copies
    finally:
        own_redis.close()
    warnings = [r.getMessage() for r in caplog.records if "Redis cache" in r.getMessage()]
    assert len(warnings) == 1 and "using the local cache for 5 s" in warnings[0], warnings


def test_configuration_errors_name_what_is_wrong(tmp_path, monkeypatch):
    monkeypatch.delenv("PORTABLE_GUIDED_CACHE_SECRET", raising=False)
    with pytest.raises(ValueError, match="needs the fleet's secret: set "
                                         "PORTABLE_GUIDED_CACHE_SECRET"):
        RedisCache("redis://127.0.0.1:1/0")
    with pytest.raises(ValueError, match="must start with redis://.*got 'http://x'"):
        RedisCache("http://x", secret=SECRET)
    monkeypatch.setenv("PORTABLE_GUIDED_CACHE_URL", "redis://127.0.0.1:1/0")
    monkeypatch.setenv("PORTABLE_GUIDED_CACHE_SECRET", SECRET)
    cache = open_cache(str(tmp_path))
    assert isinstance(cache, RedisCache) and isinstance(cache.local, DiskCache)
    assert cache.local.secret() == SECRET.encode()
    assert not (tmp_path / "secret").exists()


def test_unreachable_redis_at_start_costs_one_timeout(info, tmp_path, monkeypatch):
    """Nothing listens at the URL: the first call is refused at once, later ones skip Redis."""
    server = RedisServer(tmp_path)
    url = server.url
    server.kill()
    monkeypatch.setenv("PORTABLE_GUIDED_CACHE_SECRET", SECRET)
    with GrammarRuntime(info, ENGINE, compile_timeout_s=None, cache_url=url) as rt:
        t0 = time.monotonic()
        assert rt.compile(OBJECT).source == "local"
        assert time.monotonic() - t0 < 2.0
        assert rt.metrics()["cache_problems"] == 1
