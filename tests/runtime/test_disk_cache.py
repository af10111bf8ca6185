"""The on-disk cache: versions in the key, size bound, single flight across processes,
corrupted and stale entries logged and replaced."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import textwrap
import threading
import time
from importlib import metadata

import pytest

from portable_guided.runtime import GrammarRuntime, GrammarSpec
from portable_guided.runtime.cache import DiskCache
from portable_guided.runtime.engines.llguidance import LLGuidanceEngine
from portable_guided.runtime.engines.xgrammar import XGrammarEngine

SCHEMA = {"type": "object", "properties": {"id": {"type": "integer"},
          "tags": {"type": "array", "items": {"type": "string", "maxLength": 12}}},
          "required": ["id"]}


def test_engine_versions_come_from_package_metadata():
    assert XGrammarEngine.version() == metadata.version("xgrammar") != "unknown"
    assert LLGuidanceEngine.version() == metadata.version("llguidance") != "unknown"


def test_another_library_version_misses(deepseek, tmp_path, monkeypatch):
    spec = GrammarSpec.json_schema(SCHEMA)
    with GrammarRuntime(deepseek, "xgrammar", compile_timeout_s=None,
                        disk_cache_dir=str(tmp_path)) as rt:
        assert rt.compile(spec).source == "local"
    with GrammarRuntime(deepseek, "xgrammar", compile_timeout_s=None,
                        disk_cache_dir=str(tmp_path)) as rt:
        assert rt.compile(spec).source == "disk"
    monkeypatch.setattr(XGrammarEngine, "version", staticmethod(lambda: "0.2.9"))
    with GrammarRuntime(deepseek, "xgrammar", compile_timeout_s=None,
                        disk_cache_dir=str(tmp_path)) as rt:
        assert rt.compile(spec).source == "local"  # an upgrade never loads old entries
    assert len(list(tmp_path.rglob("*.grammar"))) == 2


def test_size_bound_evicts_least_recently_used(tmp_path):
    cache = DiskCache(tmp_path, max_bytes=3 * 1100)
    header = len(b"portable-guided-grammar-v3 ") + 64 + 1 + 64 + 1  # magic key sha\n
    for i, key in enumerate(("a1", "b2", "c3")):
        cache.put(key * 32, "x" * (1100 - header))
        os.utime(cache._path(key * 32), (1000 + i, 1000 + i))  # a1 oldest
    assert sum(size for _, size, _ in cache.entries()) == 3 * 1100
    assert cache.get("a1" * 32) == "x" * (1100 - header)  # a hit makes a1 the most recent
    cache.put("d4" * 32, "y" * (1100 - header))  # over the bound by one entry: b2 goes
    assert cache.get("b2" * 32) is None
    assert [cache.get(k * 32) is not None for k in ("a1", "c3", "d4")] == [True, True, True]
    assert sum(size for _, size, _ in cache.entries()) <= cache.max_bytes
    with pytest.raises(ValueError, match="max_bytes must be an int >= 0, got -1"):
        DiskCache(tmp_path, max_bytes=-1)


def test_corrupted_entry_is_logged_removed_and_rewritten(deepseek, tmp_path, caplog):
    spec = GrammarSpec.json_schema(SCHEMA)
    with GrammarRuntime(deepseek, "xgrammar", compile_timeout_s=None,
                        disk_cache_dir=str(tmp_path)) as rt:
        rt.compile(spec)
    (path,) = tmp_path.rglob("*.grammar")
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])  # truncated, as by a full disk
    caplog.set_level(logging.WARNING, logger="portable_guided")
    with GrammarRuntime(deepseek, "xgrammar", compile_timeout_s=None,
                        disk_cache_dir=str(tmp_path)) as rt:
        assert rt.compile(spec).source == "local"
    assert [r.getMessage() for r in caplog.records if "is corrupted" in r.getMessage()]
    assert path.read_bytes() == data  # replaced by a good entry
    with GrammarRuntime(deepseek, "xgrammar", compile_timeout_s=None,
                        disk_cache_dir=str(tmp_path)) as rt:
        assert rt.compile(spec).source == "disk"


def test_stale_entry_the_engine_cannot_load_is_replaced(deepseek, tmp_path, caplog):
    spec = GrammarSpec.json_schema(SCHEMA)
    with GrammarRuntime(deepseek, "llguidance", compile_timeout_s=None,
                        disk_cache_dir=str(tmp_path)) as rt:
        rt.compile(spec)
    (path,) = tmp_path.rglob("*.grammar")
    good = path.read_bytes()
    key = path.stem
    DiskCache(tmp_path).put(key, '{"grammars": "from another version"}')  # valid checksum
    caplog.set_level(logging.WARNING, logger="portable_guided")
    with GrammarRuntime(deepseek, "llguidance", compile_timeout_s=None,
                        disk_cache_dir=str(tmp_path)) as rt:
        assert rt.compile(spec).source == "local"
    assert any("could not be loaded by llguidance" in r.getMessage() for r in caplog.records)
    assert path.read_bytes() == good


_RACER = textwrap.dedent("""
    import json, os, sys, time
    from portable_guided.runtime import GrammarRuntime, GrammarSpec, load_tokenizer_info
    folder, me, schema = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
    info = load_tokenizer_info("deepseek", vocab_size=129_344)
    rt = GrammarRuntime(info, "xgrammar", compile_timeout_s=None, disk_cache_dir=folder)
    rt.compile(GrammarSpec.regex("[ab]"))  # engine and tokenizer built before the start line
    open(os.path.join(folder, "ready-" + me), "w").close()
    while len([f for f in os.listdir(folder) if f.startswith("ready-")]) < 2:
        time.sleep(0.001)
    m0, t0 = rt.metrics(), time.perf_counter()
    c = rt.compile(GrammarSpec.json_schema(schema))
    m = rt.metrics()
    print(json.dumps({"source": c.source, "compiles": m["compiles"] - m0["compiles"],
                      "disk": m["cache_hits_disk"] - m0["cache_hits_disk"],
                      "s": time.perf_counter() - t0}))
    rt.close()
""")


def _racing_schema() -> dict:
    # Slow enough for xgrammar (about 0.5 s here) that two unlocked processes both compile.
    props = {f"p{i}": {"type": "string", "pattern": f"^[a-z]{{{i % 5 + 1},{i % 7 + 8}}}[0-9]+$"}
             for i in range(12)}
    return {"type": "object", "properties": props, "required": list(props)}


def test_single_flight_across_processes(tmp_path):
    schema = json.dumps(_racing_schema())
    env = dict(os.environ, PYTHONPATH=os.getcwd())
    procs = [subprocess.Popen([sys.executable, "-c", _RACER, str(tmp_path), str(i), schema],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
             for i in range(2)]
    results = []
    for proc in procs:
        out, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, err[-2000:]
        results.append(json.loads(out.strip().splitlines()[-1]))
    assert sorted(r["source"] for r in results) == ["disk", "local"], results
    assert sum(r["compiles"] for r in results) == 1, results
    assert sum(r["disk"] for r in results) == 1, results


def test_single_flight_waits_at_most_wait_s(tmp_path):
    cache = DiskCache(tmp_path)
    script = textwrap.dedent(f"""
        import time
        from portable_guided.runtime.cache import DiskCache
        with DiskCache({str(tmp_path)!r}).single_flight("k" * 64) as held:
            assert held
            print("held", flush=True)
            time.sleep(3)
    """)
    env = dict(os.environ, PYTHONPATH=os.getcwd())
    holder = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True,
                              env=env)
    try:
        assert holder.stdout.readline().strip() == "held"
        t0 = time.monotonic()
        with cache.single_flight("k" * 64, wait_s=0.3) as held:
            waited = time.monotonic() - t0
        assert held is False and 0.3 <= waited < 2.0
        with cache.single_flight("other" + "k" * 59, wait_s=0.3) as held:
            assert held is True  # other keys are not blocked
    finally:
        holder.wait(timeout=30)


def test_stale_temporary_files_are_removed_and_live_ones_counted(tmp_path):
    """A writer killed mid-write left its ``*.tmp`` file forever, outside the size bound
    (252 MiB of them in a cache bounded at 1 MiB)."""
    cache = DiskCache(tmp_path, max_bytes=1000)
    body = "x" * (300 - 157)  # 300-byte entries (157 bytes of header)
    assert cache.put("a1" * 32, body)
    os.utime(cache._path("a1" * 32), (1000, 1000))  # the least recently used entry
    (tmp_path / "b2").mkdir()
    dead = tmp_path / "b2" / "tmpdead.tmp"  # a killed writer's: a day old
    dead.write_bytes(b"d" * 5000)
    old = time.time() - 86400
    os.utime(dead, (old, old))
    (tmp_path / "a1" / "tmplive.tmp").write_bytes(b"l" * 600)  # another process writing
    assert cache.put("c3" * 32, body)  # 300 + 300 + 600 bytes: over the bound, a1 goes
    left = sorted(p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*") if p.is_file())
    assert left == ["a1/tmplive.tmp", f"c3/{'c3' * 32}.grammar", "secret"]
    assert cache.get("c3" * 32) == body and cache.problems == 0


def test_lock_files_are_removed_once_nobody_holds_them(tmp_path):
    """Every key ever compiled left ``locks/<key>.lock`` behind: 3,000 keys, 43 entries kept,
    3,000 lock files."""
    cache = DiskCache(tmp_path, max_bytes=3 * 300)
    keys = [DiskCache.make_key(spec=i) for i in range(200)]
    for key in keys:  # what the compile service does on each miss
        with cache.single_flight(key, wait_s=1.0) as held:
            assert held
            assert cache.put(key, "g" * (300 - 157))
    assert os.listdir(tmp_path / "locks") == [keys[-1] + ".lock"]  # held during its put
    assert len(cache.entries()) == 3
    cache.evict()
    assert os.listdir(tmp_path / "locks") == []
    assert cache.problems == 0


def test_a_held_lock_file_is_kept_and_a_removed_one_is_retaken(tmp_path):
    """Removing lock files is safe: one held elsewhere stays, and a process that locked a
    file removed under it locks the path's new file instead of the removed one (which a
    third process could bypass)."""
    import fcntl

    cache = DiskCache(tmp_path)
    key = "k" * 64
    path = tmp_path / "locks" / f"{key}.lock"
    path.parent.mkdir()
    other = os.open(path, os.O_RDWR | os.O_CREAT)  # another process, compiling the key
    fcntl.flock(other, fcntl.LOCK_EX)
    cache.put("ab" * 32, "x")
    assert os.path.samestat(os.stat(path), os.fstat(other))  # held: kept

    inside, leave = threading.Event(), threading.Event()

    def taker() -> None:
        with cache.single_flight(key, wait_s=10) as held:
            assert held
            inside.set()
            leave.wait(10)

    thread = threading.Thread(target=taker)
    thread.start()
    try:
        time.sleep(0.2)  # the taker opened the file and waits for its lock
        os.unlink(path)  # what evict() does while it holds the lock
        fcntl.flock(other, fcntl.LOCK_UN)
        os.close(other)
        assert inside.wait(10)
        third = os.open(path, os.O_RDWR | os.O_CREAT)
        try:
            with pytest.raises(BlockingIOError):
                fcntl.flock(third, fcntl.LOCK_EX | fcntl.LOCK_NB)
        finally:
            os.close(third)
    finally:
        leave.set()
        thread.join(10)
    cache.evict()
    assert not path.exists() and cache.problems == 0


_LOCKER = textwrap.dedent("""
    import os, sys, time
    from portable_guided.runtime.cache import DiskCache
    folder, me = sys.argv[1], sys.argv[2]
    cache = DiskCache(folder, max_bytes=300)  # one entry: each write evicts, removes locks
    overlaps = 0
    for i in range(150):
        key = DiskCache.make_key(spec=i % 3)
        with cache.single_flight(key, wait_s=10) as held:
            assert held
            marker = os.path.join(folder, "inside-" + key)
            try:
                os.close(os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
                mine = True
            except FileExistsError:  # another process holds this key's lock too
                overlaps += 1
                mine = False
            time.sleep(0.001)
            cache.put(key, me * 100)
            if mine:
                os.unlink(marker)
    print(overlaps, cache.problems)
""")


def test_lock_files_removed_under_contention_still_exclude(tmp_path):
    """Four processes take and release three keys' locks while each write removes the lock
    files nobody holds: no two ever hold one key at once."""
    env = dict(os.environ, PYTHONPATH=os.getcwd())
    procs = [subprocess.Popen([sys.executable, "-c", _LOCKER, str(tmp_path), str(i)],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
             for i in range(4)]
    for proc in procs:
        out, err = proc.communicate(timeout=60)
        assert proc.returncode == 0, err[-2000:]
        assert out.split() == ["0", "0"], out
