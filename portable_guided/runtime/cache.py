"""Caches of compiled grammars: in memory (bounded in bytes), failures (short-lived) and on
disk (serialized grammars keyed by tokenizer fingerprint, spec and library versions)."""

from __future__ import annotations

import hashlib
import os
import tempfile
import threading
import time
from collections import OrderedDict
from typing import Any, Generic, TypeVar

__all__ = ["ByteLRUCache", "DiskCache", "FailureCache"]

V = TypeVar("V")


class ByteLRUCache(Generic[V]):
    """A thread-safe LRU cache whose total size (in bytes, given per entry) stays at or
    under ``max_bytes``. An entry larger than ``max_bytes`` is not stored."""

    def __init__(self, max_bytes: int) -> None:
        if max_bytes < 0:
            raise ValueError(f"max_bytes must be >= 0, got {max_bytes}")
        self.max_bytes = int(max_bytes)
        self._data: OrderedDict[str, tuple[V, int]] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()

    def get(self, key: str) -> V | None:
        """The value for ``key`` (marked most recently used) or None."""
        with self._lock:
            item = self._data.get(key)
            if item is None:
                return None
            self._data.move_to_end(key)
            return item[0]

    def put(self, key: str, value: V, nbytes: int) -> None:
        """Store ``value``; evicts least recently used entries to stay within budget."""
        with self._lock:
            old = self._data.pop(key, None)
            if old is not None:
                self._bytes -= old[1]
            if nbytes > self.max_bytes:
                return
            self._data[key] = (value, nbytes)
            self._bytes += nbytes
            while self._bytes > self.max_bytes:
                _, (_, size) = self._data.popitem(last=False)
                self._bytes -= size

    @property
    def nbytes(self) -> int:
        """Bytes currently held."""
        return self._bytes

    def __len__(self) -> int:
        return len(self._data)


class FailureCache:
    """Remembers failed compiles for ``ttl_s`` seconds, so a bad spec that many requests
    share fails fast instead of being recompiled (and timing out) again and again."""

    def __init__(self, ttl_s: float, max_entries: int = 4096) -> None:
        self.ttl_s = float(ttl_s)
        self._data: OrderedDict[str, tuple[BaseException, float]] = OrderedDict()
        self._max = max_entries
        self._lock = threading.Lock()

    def get(self, key: str) -> BaseException | None:
        """The cached error for ``key`` if it has not expired."""
        with self._lock:
            item = self._data.get(key)
            if item is None:
                return None
            if item[1] < time.monotonic():
                del self._data[key]
                return None
            return item[0]

    def put(self, key: str, error: BaseException) -> None:
        """Remember ``error`` for ``ttl_s`` seconds."""
        if self.ttl_s <= 0:
            return
        with self._lock:
            self._data[key] = (error, time.monotonic() + self.ttl_s)
            while len(self._data) > self._max:
                self._data.popitem(last=False)


class DiskCache:
    """Serialized compiled grammars under a directory, one file per key, written atomically
    (write to a temporary file, then rename), so several processes or tensor-parallel ranks
    can share the directory."""

    def __init__(self, directory: str | os.PathLike[str]) -> None:
        self.directory = os.fspath(directory)
        os.makedirs(self.directory, exist_ok=True)

    @staticmethod
    def make_key(**parts: Any) -> str:
        """A stable hash of the key parts (tokenizer fingerprint, spec key, versions...)."""
        text = "\0".join(f"{k}={parts[k]}" for k in sorted(parts))
        return hashlib.sha256(text.encode()).hexdigest()

    def _path(self, key: str) -> str:
        return os.path.join(self.directory, key[:2], key + ".grammar")

    def get(self, key: str) -> str | None:
        """The stored text for ``key`` or None."""
        try:
            with open(self._path(key), encoding="utf-8") as fh:
                return fh.read()
        except FileNotFoundError:
            return None

    def put(self, key: str, text: str) -> None:
        """Store ``text`` under ``key`` atomically."""
        path = self._path(key)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path), suffix=".tmp")
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as fh:
                fh.write(text)
            os.replace(tmp, path)
        except BaseException:
            try:
                os.unlink(tmp)
            except OSError:
                pass
            raise
