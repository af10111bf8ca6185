"""Caches of compiled grammars: in memory (bounded in bytes), failures (short-lived) and on
disk (serialized grammars keyed by tokenizer fingerprint, spec and library versions; bounded
in bytes, checksummed, one compile across processes on a miss)."""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import tempfile
import threading
import time
from collections import OrderedDict
from collections.abc import Iterator
from typing import Any, Generic, TypeVar

__all__ = ["ByteLRUCache", "DiskCache", "FailureCache"]

log = logging.getLogger(__name__)

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
    """Serialized compiled grammars under a directory, one file per key, shared by processes.

    - Writes are atomic (a temporary file, then rename); each entry starts with a header
      holding the SHA-256 of its text, so a truncated or corrupted entry is detected, logged
      and removed instead of loaded (the caller then compiles and writes it again).
    - The directory stays at or under ``max_bytes``: after each write the least recently used
      entries (by modification time; a hit touches its entry) are removed.
    - :meth:`single_flight` serializes compile-on-miss across processes with an ``flock`` per
      key: when several processes (or tensor-parallel ranks) miss the same key at once, one
      compiles and the others wait, then read its entry.
    """

    def __init__(self, directory: str | os.PathLike[str], max_bytes: int = 2 << 30) -> None:
        if isinstance(max_bytes, bool) or not isinstance(max_bytes, int) or max_bytes < 0:
            raise ValueError(f"max_bytes must be an int >= 0, got {max_bytes!r}")
        self.directory = os.fspath(directory)
        self.max_bytes = max_bytes
        os.makedirs(self.directory, exist_ok=True)

    @staticmethod
    def make_key(**parts: Any) -> str:
        """A stable hash of the key parts (tokenizer fingerprint, spec key, versions...)."""
        text = "\0".join(f"{k}={parts[k]}" for k in sorted(parts))
        return hashlib.sha256(text.encode()).hexdigest()

    def _path(self, key: str) -> str:
        return os.path.join(self.directory, key[:2], key + ".grammar")

    def get(self, key: str) -> str | None:
        """The stored text for ``key``, or None (absent, or corrupted: logged and removed)."""
        path = self._path(key)
        try:
            with open(path, "rb") as fh:
                data = fh.read()
        except FileNotFoundError:
            return None
        header, _, body = data.partition(b"\n")
        parts = header.split(b" ")
        if len(parts) != 2 or parts[0] != _MAGIC or parts[1] != _digest(body).encode():
            log.warning("disk cache entry %s is corrupted (%d bytes, header %r); removing it",
                        path, len(data), header[:80])
            self.remove(key)
            return None
        try:
            os.utime(path)  # most recently used: evicted last
        except OSError:
            pass
        return body.decode("utf-8")

    def put(self, key: str, text: str) -> None:
        """Store ``text`` under ``key`` atomically, then evict down to ``max_bytes``."""
        path = self._path(key)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        body = text.encode("utf-8")
        fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path), suffix=".tmp")
        try:
            with os.fdopen(fd, "wb") as fh:
                fh.write(_MAGIC + b" " + _digest(body).encode() + b"\n" + body)
            os.replace(tmp, path)
        except BaseException:
            try:
                os.unlink(tmp)
            except OSError:
                pass
            raise
        self.evict()

    def remove(self, key: str) -> None:
        """Remove ``key``'s entry (e.g. one the engine could not load)."""
        try:
            os.unlink(self._path(key))
        except FileNotFoundError:
            pass

    def entries(self) -> list[tuple[float, int, str]]:
        """``(mtime, bytes, path)`` of every entry, least recently used first."""
        found = []
        for sub in os.scandir(self.directory):
            if not sub.is_dir() or len(sub.name) != 2:
                continue
            for entry in os.scandir(sub.path):
                if entry.name.endswith(".grammar"):
                    try:
                        st = entry.stat()
                    except FileNotFoundError:  # removed by another process meanwhile
                        continue
                    found.append((st.st_mtime, st.st_size, entry.path))
        return sorted(found)

    def evict(self) -> int:
        """Remove least recently used entries until the total is at most ``max_bytes``;
        returns how many were removed."""
        entries = self.entries()
        total = sum(size for _, size, _ in entries)
        removed = 0
        for _, size, path in entries:
            if total <= self.max_bytes:
                break
            try:
                os.unlink(path)
                removed += 1
            except FileNotFoundError:
                pass
            total -= size
        if removed:
            log.info("disk cache %s: evicted %d entries to stay within %d bytes",
                     self.directory, removed, self.max_bytes)
        return removed

    @contextlib.contextmanager
    def single_flight(self, key: str, wait_s: float | None = None) -> Iterator[bool]:
        """Hold ``key``'s inter-process lock for a compile-on-miss; yields whether it is held.

        Other processes entering with the same key wait (up to ``wait_s`` seconds, default
        forever) until this one leaves, then find its entry. The operating system releases
        the lock if the holder dies. Without ``fcntl`` (Windows) nothing is locked.
        """
        try:
            import fcntl
        except ImportError:  # pragma: no cover - no flock: every process compiles
            yield False
            return
        folder = os.path.join(self.directory, "locks")
        os.makedirs(folder, exist_ok=True)
        fd = os.open(os.path.join(folder, key + ".lock"), os.O_RDWR | os.O_CREAT, 0o644)
        try:
            held = _flock(fcntl, fd, wait_s)
            if not held:
                log.warning("disk cache: waited %.1f s for another process compiling %s; "
                            "compiling here too", wait_s, key[:16])
            try:
                yield held
            finally:
                if held:
                    fcntl.flock(fd, fcntl.LOCK_UN)
        finally:
            os.close(fd)


_MAGIC = b"portable-guided-grammar-v1"


def _digest(body: bytes) -> str:
    return hashlib.sha256(body).hexdigest()


def _flock(fcntl: Any, fd: int, wait_s: float | None) -> bool:
    if wait_s is None:
        fcntl.flock(fd, fcntl.LOCK_EX)
        return True
    deadline = time.monotonic() + wait_s
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.02)
