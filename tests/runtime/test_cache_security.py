"""The disk cache no one else can poison (issue 38): entries authenticated by an HMAC under a
secret, a secret made once per directory (mode 0600, processes racing agree), directories
and entries another user owns or others can write refused unless shared on purpose."""

from __future__ import annotations

import hashlib
import logging
import os
import stat
import subprocess
import sys
import textwrap

import numpy as np
import pytest
from runtime_helpers import allowed, disk_entries, first_mask

from portable_guided.runtime import GrammarRuntime, GrammarSpec
from portable_guided.runtime.cache import (
    SECRET_ENV,
    SHARED_ENV,
    DiskCache,
    pack_entry,
    unpack_entry,
    unsafe_reason,
)

OBJECT = GrammarSpec.json_schema({"type": "object"})
ARRAY = GrammarSpec.json_schema({"type": "array"})
MAGIC = b"portable-guided-grammar-v3"


@pytest.fixture(autouse=True)
def _no_cache_env(monkeypatch):
    for name in (SECRET_ENV, SHARED_ENV, "PORTABLE_GUIDED_CACHE_URL"):
        monkeypatch.delenv(name, raising=False)



def _first_chars(info, mask: np.ndarray) -> set[str]:
    return {info.decode([int(t)]).lstrip()[:1] for t in allowed(mask, info.vocab_size)}


@pytest.mark.parametrize("engine", ["xgrammar", "llguidance"])
@pytest.mark.parametrize("forged_mac", ["array-entry-mac", "sha256-of-body"])
def test_forged_entry_is_a_miss_and_never_loaded(deepseek, tmp_path, caplog, engine,
                                                 forged_mac):
    """The forgery of issue 38: the array grammar's body written under the object schema's
    entry with a header naming the object's key. Before, a new runtime served the object
    schema with the array grammar (first tokens ``[``, ``["``, ``[-``)."""
    with GrammarRuntime(deepseek, engine, compile_timeout_s=None,
                        disk_cache_dir=str(tmp_path)) as rt:
        array_entry, object_entry = disk_entries(rt, tmp_path, ARRAY, OBJECT)
        expected = first_mask(rt, OBJECT)
    assert _first_chars(deepseek, expected) <= {"{", ""}
    assert "{" in _first_chars(deepseek, expected)
    header, _, body = array_entry.read_bytes().partition(b"\n")
    mac = (header.split(b" ")[2] if forged_mac == "array-entry-mac"
           else hashlib.sha256(body).hexdigest().encode())
    object_entry.write_bytes(MAGIC + b" " + object_entry.stem.encode() + b" " + mac + b"\n"
                             + body)
    caplog.set_level(logging.WARNING, logger="portable_guided")
    with GrammarRuntime(deepseek, engine, compile_timeout_s=None,
                        disk_cache_dir=str(tmp_path)) as rt:
        assert rt.compile(OBJECT).source == "local"
        got = first_mask(rt, OBJECT)
        assert rt.metrics()["cache_entries_rejected"] == 1
    np.testing.assert_array_equal(got, expected)
    assert "[" not in _first_chars(deepseek, got)
    rejected = [r.getMessage() for r in caplog.records if "MAC does not verify" in r.getMessage()]
    assert len(rejected) == 1 and str(object_entry) in rejected[0], rejected
    with GrammarRuntime(deepseek, engine, compile_timeout_s=None,
                        disk_cache_dir=str(tmp_path)) as rt:
        assert rt.compile(OBJECT).source == "disk"  # rewritten, authentic
        np.testing.assert_array_equal(first_mask(rt, OBJECT), expected)


def test_entry_made_under_another_secret_is_rejected(tmp_path, monkeypatch):
    key = DiskCache.make_key(spec="s")
    assert DiskCache(tmp_path, secret="fleet-secret-one-0123456789").put(key, "grammar")
    assert not (tmp_path / "secret").exists()  # a given secret makes no file
    other = DiskCache(tmp_path, secret="fleet-secret-two-0123456789")
    assert other.get(key) is None and other.rejected == 1
    assert not DiskCache(tmp_path, secret="fleet-secret-one-0123456789").get(key)  # removed
    monkeypatch.setenv(SECRET_ENV, "fleet-secret-one-0123456789")
    env_cache = DiskCache(tmp_path)
    assert env_cache.put(key, "grammar") and env_cache.get(key) == "grammar"
    assert DiskCache(tmp_path, secret="fleet-secret-one-0123456789").get(key) == "grammar"
    with pytest.raises(ValueError, match="at least 16 bytes .* got 5 bytes"):
        DiskCache(tmp_path, secret="short")


def test_pack_and_unpack_bind_key_body_and_secret():
    secret = b"s" * 32
    data = pack_entry(secret, "k" * 64, "body")
    assert unpack_entry(secret, "k" * 64, data) == "body"
    assert unpack_entry(secret, "j" * 64, data) is None
    assert unpack_entry(b"t" * 32, "k" * 64, data) is None
    assert unpack_entry(secret, "k" * 64, data[:-1]) is None
    assert unpack_entry(secret, "k" * 64, data + b"x") is None


def test_secret_and_directories_are_private(tmp_path):
    folder = tmp_path / "cache"
    cache = DiskCache(folder)
    key = DiskCache.make_key(spec="x")
    assert cache.put(key, "text")
    with cache.single_flight(key, wait_s=1) as held:
        assert held
        assert stat.S_IMODE(os.stat(cache.lock_path(key)).st_mode) == 0o600
    modes = {p.relative_to(folder).as_posix(): stat.S_IMODE(p.stat().st_mode)
             for p in [folder, *folder.iterdir()] if p.name != key + ".lock"}
    assert modes == {".": 0o700, key[:2]: 0o700, "locks": 0o700, "secret": 0o600}
    secret = (folder / "secret").read_bytes().strip()
    assert len(secret) == 64 and int(secret, 16) >= 0
    assert cache.secret() == secret == DiskCache(folder).secret()


_SECRET_RACER = textwrap.dedent("""
    import os, sys, time
    from portable_guided.runtime.cache import DiskCache
    folder, start = sys.argv[1], float(sys.argv[2])
    time.sleep(max(0.0, start - time.time()))  # all wake within a millisecond or so
    print(DiskCache(folder).secret().decode())
""")


def test_processes_racing_to_make_the_secret_agree(tmp_path):
    import time

    env = {k: v for k, v in os.environ.items() if k != SECRET_ENV}
    env["PYTHONPATH"] = os.getcwd()
    start = time.time() + 2.0  # every process imported and sleeping by then
    procs = [subprocess.Popen([sys.executable, "-c", _SECRET_RACER, str(tmp_path / "c"),
                               str(start)], stdout=subprocess.PIPE, text=True, env=env)
             for _ in range(6)]
    outs = [p.communicate(timeout=60)[0].strip() for p in procs]
    assert all(p.returncode == 0 for p in procs)
    assert len(set(outs)) == 1 and len(outs[0]) == 64, outs
    assert sorted(os.listdir(tmp_path / "c")) == ["secret"]  # no temporary file left


def test_unsafe_reason_predicate():
    def st(mode: int, uid: int) -> os.stat_result:
        return os.stat_result((mode, 0, 0, 1, uid, 0, 0, 0, 0, 0))

    assert unsafe_reason(st(0o40700, 1000), uid=1000) is None
    assert unsafe_reason(st(0o40755, 0), uid=1000) is None  # root's, not writable by others
    assert unsafe_reason(st(0o40700, 1001), uid=1000) == (
        "owned by uid 1001, not by this process's uid 1000 (nor root)")
    assert unsafe_reason(st(0o40770, 1000), uid=1000) == "writable by group or others (mode 0o770)"
    assert unsafe_reason(st(0o100602, 1000), uid=1000) == (
        "writable by group or others (mode 0o602)")


def test_directory_writable_by_others_is_not_used(deepseek, tmp_path, caplog):
    folder = tmp_path / "c"
    folder.mkdir()
    folder.chmod(0o777)
    caplog.set_level(logging.WARNING, logger="portable_guided")
    cache = DiskCache(folder)
    assert cache.unusable is not None and str(folder) in cache.unusable
    key = DiskCache.make_key(spec="x")
    assert cache.put(key, "text") is False and cache.get(key) is None
    with cache.single_flight(key, wait_s=1) as held:
        assert held is False
    assert os.listdir(folder) == []  # nothing written, not even a secret
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warnings) == 1, warnings
    assert f"{folder} is writable by group or others (mode 0o777)" in warnings[0]
    # The runtime compiles without the cache; shared=True uses it (the MAC protects it).
    with GrammarRuntime(deepseek, "xgrammar", compile_timeout_s=None,
                        disk_cache_dir=str(folder)) as rt:
        assert rt.compile(OBJECT).source == "local"
        assert not rt.new_request(OBJECT).wait(30).failed
    assert os.listdir(folder) == []
    shared = DiskCache(folder, shared=True)
    assert shared.unusable is None and shared.put(key, "text") and shared.get(key) == "text"


def test_entry_or_subdirectory_writable_by_others_is_refused(tmp_path, caplog, monkeypatch):
    cache = DiskCache(tmp_path)
    key = DiskCache.make_key(spec="x")
    assert cache.put(key, "text")
    entry = tmp_path / key[:2] / f"{key}.grammar"
    entry.chmod(0o666)
    caplog.set_level(logging.WARNING, logger="portable_guided")
    assert cache.get(key) is None and cache.problems == 1
    assert any(f"{entry} is writable by group or others (mode 0o666)" in r.getMessage()
               for r in caplog.records)
    assert DiskCache(tmp_path, shared=True).get(key) == "text"
    monkeypatch.setenv(SHARED_ENV, "1")
    assert DiskCache(tmp_path).get(key) == "text"
    monkeypatch.delenv(SHARED_ENV)
    entry.chmod(0o600)
    (tmp_path / key[:2]).chmod(0o777)
    assert cache.put(key, "new") is False  # the subdirectory is not written into
    assert cache.get(key) == "text"


def test_secret_readable_by_others_is_refused(tmp_path):
    DiskCache(tmp_path).secret()
    (tmp_path / "secret").chmod(0o644)
    cache = DiskCache(tmp_path)
    assert cache.secret() is None and cache.put(DiskCache.make_key(spec="x"), "t") is False
    assert cache.problems == 1
    assert DiskCache(tmp_path, shared=True).secret() is not None


def test_a_secret_file_without_a_secret_disables_the_cache_once(tmp_path):
    (tmp_path / "secret").write_bytes(b"short\n")
    (tmp_path / "secret").chmod(0o600)
    cache = DiskCache(tmp_path)
    key = DiskCache.make_key(spec="x")
    assert cache.secret() is None and cache.put(key, "t") is False and cache.get(key) is None
    assert cache.problems == 1 and "holds no secret of 64 hex digits (5 bytes)" in cache.unusable


@pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() != 0,
                    reason="giving a file to another user needs root")
def test_directory_and_entry_owned_by_another_user_are_refused(tmp_path, caplog):
    cache = DiskCache(tmp_path / "c")
    key = DiskCache.make_key(spec="x")
    assert cache.put(key, "text")
    entry = tmp_path / "c" / key[:2] / f"{key}.grammar"
    os.chown(entry, 12345, 12345)
    caplog.set_level(logging.WARNING, logger="portable_guided")
    assert cache.get(key) is None
    assert any(f"{entry} is owned by uid 12345" in r.getMessage() for r in caplog.records)
    os.chown(tmp_path / "c", 12345, 12345)
    assert DiskCache(tmp_path / "c").unusable.startswith(
        f"{tmp_path / 'c'} is owned by uid 12345, not by this process's uid 0")
    assert DiskCache(tmp_path / "c", shared=True).get(key) == "text"


def test_runtime_reads_the_cache_settings_from_the_environment(deepseek, tmp_path,
                                                               monkeypatch):
    """What the vLLM and SGLang backends rely on: a runtime built with only a directory
    takes the secret and the shared flag from the environment."""
    monkeypatch.setenv(SECRET_ENV, "fleet-secret-one-0123456789")
    monkeypatch.setenv(SHARED_ENV, "1")
    folder = tmp_path / "c"
    folder.mkdir()
    folder.chmod(0o777)  # shared on purpose
    with GrammarRuntime(deepseek, "llguidance", compile_timeout_s=None,
                        disk_cache_dir=str(folder)) as rt:
        assert rt.compile(OBJECT).source == "local"
    (entry,) = folder.rglob("*.grammar")
    reader = DiskCache(folder, secret="fleet-secret-one-0123456789", shared=True)
    assert reader.get(entry.stem) is not None and not (folder / "secret").exists()
    monkeypatch.setenv(SHARED_ENV, "0")
    with GrammarRuntime(deepseek, "llguidance", compile_timeout_s=None,
                        disk_cache_dir=str(folder)) as rt:
        assert rt.compile(OBJECT).source == "local"  # not shared: the directory is refused
        assert rt.metrics()["cache_problems"] == 1
    with GrammarRuntime(deepseek, "llguidance", compile_timeout_s=None,
                        disk_cache_dir=str(folder), cache_shared=True) as rt:
        assert rt.compile(OBJECT).source == "disk"


def test_a_secret_made_second_loses_to_the_first(tmp_path):
    """The race step by step: a process that made its secret after another one linked
    its own keeps the first one, and leaves no temporary file."""
    from portable_guided.runtime.cache import _make_secret

    path = str(tmp_path / "secret")
    _make_secret(str(tmp_path), path)
    first = (tmp_path / "secret").read_bytes()
    _make_secret(str(tmp_path), path)
    assert (tmp_path / "secret").read_bytes() == first and len(first.strip()) == 64
    assert os.listdir(tmp_path) == ["secret"]
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
