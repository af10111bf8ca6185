"""Caches of compiled grammars: in memory (bounded in bytes), failures (short-lived) and on
disk (serialized grammars keyed by tokenizer fingerprint, spec and library versions; bounded
in bytes, authenticated, one compile across processes on a miss).

:class:`GrammarCache` is what the compile service needs of a shared cache; :class:`DiskCache`
is the local directory, ``redis_cache.RedisCache`` the fleet-wide one (docs/cache.md)."""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import logging
import os
import secrets
import stat
import tempfile
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any, Generic, TypeVar

if TYPE_CHECKING:
    from .metrics import Metrics

__all__ = ["SECRET_ENV", "SHARED_ENV", "ByteLRUCache", "DiskCache", "FailureCache",
           "GrammarCache", "UnsafeCachePath", "entry_mac", "pack_entry", "unpack_entry",
           "unsafe_reason"]

#: Environment variable holding the secret that authenticates cache entries (a fleet shares
#: it); without it each cache directory makes its own (``<directory>/secret``, mode 0600).
SECRET_ENV = "PORTABLE_GUIDED_CACHE_SECRET"
#: ``1``: the cache directory is shared on purpose (other users or a group write it): its
#: ownership and mode are not checked, the entries' MACs alone protect it.
SHARED_ENV = "PORTABLE_GUIDED_CACHE_SHARED"

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

    def remove_value(self, value: V) -> bool:
        """Remove every entry holding ``value`` (by identity); returns whether one was."""
        with self._lock:
            keys = [k for k, (v, _) in self._data.items() if v is value]
            for k in keys:
                self._bytes -= self._data.pop(k)[1]
            return bool(keys)

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


class UnsafeCachePath(OSError):
    """A cache path another user owns, or that a group or others can write (not used)."""


def unsafe_reason(st: os.stat_result, uid: int | None = None) -> str | None:
    """Why a cache file or directory with status ``st`` must not be trusted by the process
    of user ``uid`` (default: this process's effective user), or None when it may be.

    Trusted: owned by that user or by root (who can write anything anyway), and writable by
    neither its group nor others.

    >>> import os
    >>> unsafe_reason(os.stat_result((0o40777, 0, 0, 0, 1000, 0, 0, 0, 0, 0)), uid=1000)
    'writable by group or others (mode 0o777)'
    """
    if uid is None:
        uid = os.geteuid() if hasattr(os, "geteuid") else st.st_uid
    if st.st_uid not in (uid, 0):
        return f"owned by uid {st.st_uid}, not by this process's uid {uid} (nor root)"
    if st.st_mode & 0o022:
        return f"writable by group or others (mode {oct(stat.S_IMODE(st.st_mode))})"
    return None


def entry_mac(secret: bytes, key: str, body: bytes) -> str:
    """HMAC-SHA256 (hex) of an entry: its key and its body, under ``secret``."""
    return hmac.new(secret, key.encode() + b"\n" + body, hashlib.sha256).hexdigest()


def pack_entry(secret: bytes, key: str, text: str) -> bytes:
    """An entry as stored (on disk or in Redis): a header line (magic, key, MAC), the body."""
    body = text.encode("utf-8")
    return _MAGIC + b" " + key.encode() + b" " + entry_mac(secret, key, body).encode() + b"\n" \
        + body


def unpack_entry(secret: bytes, key: str, data: bytes) -> str | None:
    """The text of entry ``data`` stored under ``key``, or None when it is not an entry of
    ``key`` authenticated by ``secret`` (truncated, corrupted, forged, another key's)."""
    header, _, body = data.partition(b"\n")
    parts = header.split(b" ")
    if len(parts) != 3 or parts[0] != _MAGIC or parts[1] != key.encode():
        return None
    if not hmac.compare_digest(parts[2], entry_mac(secret, key, body).encode()):
        return None
    try:
        return body.decode("utf-8")
    except UnicodeDecodeError:  # pragma: no cover - authenticated above
        return None


def _env_secret() -> bytes | None:
    value = os.environ.get(SECRET_ENV)
    return value.encode() if value else None


def _check_secret(secret: bytes | str | None) -> bytes | None:
    if secret is None:
        return None
    if isinstance(secret, str):
        secret = secret.encode()
    if not isinstance(secret, bytes) or len(secret) < 16:
        raise ValueError(f"the cache secret must be at least 16 bytes (${SECRET_ENV} or "
                         f"secret=), got {len(secret) if isinstance(secret, bytes) else secret!r}"
                         f"{' bytes' if isinstance(secret, bytes) else ''}")
    return secret


class GrammarCache:
    """What the compile service needs of a cache of serialized grammars shared by processes
    (and hosts): authenticated entries, single flight on a miss, shared failures.

    No method raises on a problem of the store: an operation that cannot be done degrades
    (a miss, no write, no lock, no failure recorded) and is counted in :attr:`problems`.
    """

    #: Problems met with the store so far (each degraded one operation).
    problems: int = 0
    #: Entries refused so far: truncated, corrupted, forged or another key's (MAC).
    rejected: int = 0

    @staticmethod
    def make_key(**parts: Any) -> str:
        """A stable hash of the key parts (tokenizer fingerprint, spec key, versions...)."""
        return _make_key(**parts)

    def __init__(self) -> None:
        self._metrics: Metrics | None = None

    def attach_metrics(self, metrics: Metrics) -> None:
        """Count this cache's events (rejected entries, degraded operations) in ``metrics``,
        those met so far (e.g. an unsafe directory at construction) included."""
        self._metrics = metrics
        for name, count in (("cache_problems", self.problems),
                            ("cache_entries_rejected", self.rejected)):
            if count:
                metrics.inc(name, count)

    def _count(self, name: str) -> None:
        if self._metrics is not None:
            self._metrics.inc(name)

    def get(self, key: str) -> str | None:
        """The stored text for ``key``, or None (absent, or not authenticated)."""
        raise NotImplementedError

    def put(self, key: str, text: str) -> bool:
        """Store ``text`` under ``key``; returns whether it was stored."""
        raise NotImplementedError

    def remove(self, key: str) -> None:
        """Remove ``key``'s entry (one the engine could not load)."""
        raise NotImplementedError

    def single_flight(self, key: str, wait_s: float | None = None) -> AbstractContextManager[bool]:
        """A context holding ``key``'s lock for a compile on a miss; yields whether held
        (others wait up to ``wait_s`` seconds, default forever, then go on unlocked)."""
        raise NotImplementedError

    def failure(self, key: str) -> tuple[str, str] | None:
        """``(error type name, message)`` of a failed compile of ``key`` another process
        recorded, while its TTL runs; None without one (or where failures are not shared)."""
        return None

    def put_failure(self, key: str, kind: str, message: str, ttl_s: float) -> None:
        """Record that compiling ``key`` failed with ``kind``/``message`` for ``ttl_s`` s
        (nothing where failures are not shared: the local directory)."""


class DiskCache(GrammarCache):
    """Serialized compiled grammars under a directory, one file per key, shared by processes.

    - Each entry starts with a header holding its key and an HMAC-SHA256 of key and body
      under a secret (``secret``, else ``$PORTABLE_GUIDED_CACHE_SECRET``, else a random one
      made in ``<directory>/secret`` with mode 0600 on first use). An entry that does not
      verify (truncated, corrupted, another key's, or written by someone without the secret)
      is a miss: logged (a warning the first time), counted in :attr:`rejected`, removed, and
      never handed to the engine. Writes are atomic (a temporary file, then rename).
    - The directory and its subdirectories are made with mode 0700. Unless ``shared`` (or
      ``$PORTABLE_GUIDED_CACHE_SHARED=1``) says the directory is shared on purpose, a
      directory or entry owned by another user (root aside) or writable by group or others
      is not used (:func:`unsafe_reason`): one warning naming it, then that operation
      degrades, as for any problem of the directory.
    - Entries are opened without blocking and read only when they are regular files: a FIFO
      or a device planted in the directory is never waited on.
    - The directory stays at or under ``max_bytes``: after each write the least recently used
      entries (by modification time; a hit touches its entry) are removed. Temporary files of
      writes count toward the bound while present; those older than an hour (left by a
      writer that was killed) are removed.
    - :meth:`single_flight` serializes compile-on-miss across processes with an ``flock`` per
      key: when several processes (or tensor-parallel ranks) miss the same key at once, one
      compiles and the others wait, then read its entry. After each write the lock files
      nobody holds are removed, so ``locks/`` holds about one file per compile in flight.
    - A cache is an optimization: no method raises on a problem of the directory (read-only,
      unreadable, unsafe or replaced entries, a file where a folder should be...). The
      operation degrades (a miss, no write, no lock), the first problem is logged as a
      warning and later ones at debug level, and :attr:`problems` counts them.
    """

    #: Age (seconds since last modified) after which eviction removes a write's temporary
    #: file: its writer was killed. A write is one ``write`` of at most a grammar (a few
    #: hundred MB) and a rename: seconds, minutes on a slow network disk, so an hour never
    #: catches a live one; if it did, that writer would only lose the write (its rename
    #: fails and is logged). Until removed, the file counts toward ``max_bytes``.
    stale_tmp_s: float = 3600.0

    def __init__(self, directory: str | os.PathLike[str], max_bytes: int = 2 << 30, *,
                 secret: bytes | str | None = None, shared: bool | None = None) -> None:
        super().__init__()
        if isinstance(max_bytes, bool) or not isinstance(max_bytes, int) or max_bytes < 0:
            raise ValueError(f"max_bytes must be an int >= 0, got {max_bytes!r}")
        self.directory = os.fspath(directory)
        self.max_bytes = max_bytes
        #: Whether the directory is shared on purpose (ownership and mode not checked).
        self.shared = (os.environ.get(SHARED_ENV, "0") == "1") if shared is None else shared
        self.problems = 0
        self.rejected = 0
        self._warned = False
        self._warned_rejected = False
        self._secret = _check_secret(secret) or _check_secret(_env_secret())
        #: Why the directory is not used (None: it is).
        self.unusable: str | None = None
        try:
            os.makedirs(self.directory, mode=0o700, exist_ok=True)
            self._check(self.directory, os.stat(self.directory))
        except UnsafeCachePath as exc:
            self.unusable = str(exc)
            self._problem("use the directory", exc)
        except OSError as exc:
            self._problem("create the directory", exc)

    def _problem(self, what: str, exc: BaseException) -> None:
        self.problems += 1
        self._count("cache_problems")
        level = logging.DEBUG if self._warned else logging.WARNING
        self._warned = True
        log.log(level, "disk cache %s: could not %s (%s: %s); going on without it for this "
                "operation (no compile fails for a cache problem)", self.directory, what,
                type(exc).__name__, exc)

    def _check(self, path: str, st: os.stat_result) -> None:
        """Raise :class:`UnsafeCachePath` naming ``path`` unless it may be trusted."""
        if not self.shared:
            reason = unsafe_reason(st)
            if reason is not None:
                raise UnsafeCachePath(f"{path} is {reason}; not used (pass shared=True or set "
                                      f"{SHARED_ENV}=1 if it is shared on purpose)")

    def _makedirs(self, path: str) -> None:
        """Make ``path`` (mode 0700) and check it (raises OSError)."""
        os.makedirs(path, mode=0o700, exist_ok=True)
        self._check(path, os.lstat(path))

    def secret(self) -> bytes | None:
        """The secret entries are authenticated with (read, or made, on first use); None
        when it cannot be had or the directory is not used."""
        if self.unusable is not None:
            return None
        if self._secret is None:
            try:
                self._secret = _directory_secret(self.directory, self._check, self.shared)
            except UnsafeCachePath as exc:
                self.unusable = str(exc)
                self._problem("use the secret", exc)
            except OSError as exc:
                self._problem("read or make the secret", exc)
        return self._secret

    def _path(self, key: str) -> str:
        return os.path.join(self.directory, key[:2], key + ".grammar")

    def get(self, key: str) -> str | None:
        """The stored text for ``key``, or None (absent, unreadable, unsafe, or not an
        authenticated entry of ``key``: logged, counted and removed)."""
        secret = self.secret()
        if secret is None:
            return None
        path = self._path(key)
        data = self._read_regular(path)
        if data is None:
            return None
        text = unpack_entry(secret, key, data)
        if text is None:
            self._reject(path, data)
            self.remove(key)
            return None
        try:
            os.utime(path)  # most recently used: evicted last
        except OSError:
            pass
        return text

    def _reject(self, where: str, data: bytes) -> None:
        self.rejected += 1
        self._count("cache_entries_rejected")
        level = logging.DEBUG if self._warned_rejected else logging.WARNING
        self._warned_rejected = True
        log.log(level, "cache entry %s is corrupted, forged or belongs to another key (its "
                "MAC does not verify: %d bytes, header %r); not loaded, removed", where,
                len(data), data.partition(b"\n")[0][:100])

    def _read_regular(self, path: str) -> bytes | None:
        """The bytes of ``path`` if it is a readable regular file that may be trusted, else
        None. Opened with ``O_NONBLOCK``: opening a FIFO for reading would otherwise wait for
        a writer."""
        try:
            fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0)
                         | getattr(os, "O_NOFOLLOW", 0))
        except FileNotFoundError:
            return None
        except OSError as exc:
            self._problem(f"open {path}", exc)
            return None
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                self._problem(f"read {path}", OSError(f"not a regular file "
                                                      f"(mode {oct(st.st_mode)})"))
                return None
            self._check(path, st)
            chunks: list[bytes] = []
            while True:
                chunk = os.read(fd, 1 << 20)
                if not chunk:
                    return b"".join(chunks)
                chunks.append(chunk)
        except OSError as exc:
            self._problem(f"read {path}", exc)
            return None
        finally:
            os.close(fd)

    def put(self, key: str, text: str) -> bool:
        """Store ``text`` under ``key`` atomically, then evict down to ``max_bytes``; returns
        whether it was stored."""
        secret = self.secret()
        if secret is None:
            return False
        path = self._path(key)
        tmp = None
        try:
            self._makedirs(os.path.dirname(path))
            fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path), suffix=".tmp")
            with os.fdopen(fd, "wb") as fh:
                fh.write(pack_entry(secret, key, text))
            os.replace(tmp, path)
        except OSError as exc:
            self._problem(f"write {path}", exc)
            if tmp is not None:
                with contextlib.suppress(OSError):
                    os.unlink(tmp)
            return False
        self.evict()
        return True

    def remove(self, key: str) -> None:
        """Remove ``key``'s entry (e.g. one the engine could not load)."""
        if self.unusable is not None:
            return
        try:
            os.unlink(self._path(key))
        except FileNotFoundError:
            pass
        except OSError as exc:
            self._problem(f"remove {self._path(key)}", exc)

    def entries(self) -> list[tuple[float, int, str]]:
        """``(mtime, bytes, path)`` of every entry (regular files only), least recently used
        first."""
        return self._scan()[0]

    def _scan(self) -> tuple[list[tuple[float, int, str]], list[tuple[float, int, str]]]:
        """``(mtime, bytes, path)`` of the entries and of the temporary files of writes."""
        found: dict[str, list[tuple[float, int, str]]] = {".grammar": [], ".tmp": []}
        try:
            subs = [sub for sub in os.scandir(self.directory)
                    if len(sub.name) == 2 and sub.is_dir(follow_symlinks=False)]
            for sub in subs:
                for entry in os.scandir(sub.path):
                    kind = found.get(os.path.splitext(entry.name)[1])
                    if kind is not None and entry.is_file(follow_symlinks=False):
                        try:
                            st = entry.stat(follow_symlinks=False)
                        except FileNotFoundError:  # removed by another process meanwhile
                            continue
                        kind.append((st.st_mtime, st.st_size, entry.path))
        except OSError as exc:
            self._problem(f"list {self.directory}", exc)
        return sorted(found[".grammar"]), found[".tmp"]

    def evict(self) -> int:
        """Remove temporary files older than :attr:`stale_tmp_s`, least recently used
        entries until the total (temporary files left included) is at most ``max_bytes``,
        and lock files nobody holds; returns how many entries went."""
        if self.unusable is not None:
            return 0
        entries, temps = self._scan()
        total = sum(size for _, size, _ in entries)
        stale = time.time() - self.stale_tmp_s
        for mtime, size, path in temps:
            if not (mtime < stale and self._unlink(path, "remove stale temporary file")):
                total += size  # a write in progress, or one that could not be removed
        removed = 0
        for _, size, path in entries:
            if total <= self.max_bytes:
                break
            if self._unlink(path, "evict"):
                removed += 1
            total -= size
        if removed:
            log.info("disk cache %s: evicted %d entries to stay within %d bytes",
                     self.directory, removed, self.max_bytes)
        self._remove_free_locks()
        return removed

    def _unlink(self, path: str, what: str) -> bool:
        """Remove ``path``; returns whether it is gone (removed here or meanwhile)."""
        try:
            os.unlink(path)
            return True
        except FileNotFoundError:
            return True
        except OSError as exc:
            self._problem(f"{what} {path}", exc)
            return False

    def _remove_free_locks(self) -> None:
        """Remove every lock file that no process holds, under its lock (see
        :meth:`single_flight` for why that is safe)."""
        try:
            import fcntl
        except ImportError:  # pragma: no cover - no flock, no lock files
            return
        folder = os.path.join(self.directory, "locks")
        try:
            paths = [entry.path for entry in os.scandir(folder)
                     if entry.name.endswith(".lock") and entry.is_file(follow_symlinks=False)]
        except FileNotFoundError:
            return
        except OSError as exc:
            self._problem(f"list {folder}", exc)
            return
        for path in paths:
            try:
                fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
            except FileNotFoundError:  # removed by another process meanwhile
                continue
            except OSError as exc:
                self._problem(f"open {path}", exc)
                continue
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                try:
                    if _names(path, fd):  # not already replaced by a newer lock file
                        os.unlink(path)
                finally:
                    fcntl.flock(fd, fcntl.LOCK_UN)
            except (BlockingIOError, FileNotFoundError):  # held: a compile in flight; gone
                pass
            except OSError as exc:
                self._problem(f"remove lock {path}", exc)
            finally:
                os.close(fd)

    def lock_path(self, key: str) -> str:
        """The file :meth:`single_flight` locks for ``key``: a process holding an ``flock``
        on it is compiling ``key``."""
        return os.path.join(self.directory, "locks", key + ".lock")

    @contextlib.contextmanager
    def single_flight(self, key: str, wait_s: float | None = None) -> Iterator[bool]:
        """Hold ``key``'s inter-process lock for a compile-on-miss; yields whether it is held.

        Other processes entering with the same key wait (up to ``wait_s`` seconds, default
        forever) until this one leaves, then find its entry. The operating system releases
        the lock if the holder dies. Without ``fcntl`` (Windows), or when the lock file
        cannot be made, nothing is locked (each process compiles).
        """
        # One lock file per key, removed by :meth:`evict` when nobody holds it, so their
        # number stays about that of compiles in flight. Removing is safe because a remover
        # unlinks a lock file only while holding its lock, and a taker, once it holds the
        # lock, checks that the path still names the file it locked (else it locked a
        # removed file that a third process could bypass by creating a new one: it takes
        # the new one instead). Fixed lock stripes (hash of the key into N files) would
        # need no removal, but would make unrelated keys wait on each other, threads of one
        # process included (each ``open`` is a separate ``flock``).
        try:
            import fcntl
        except ImportError:  # pragma: no cover - no flock: every process compiles
            yield False
            return
        if self.unusable is not None:
            yield False
            return
        path = self.lock_path(key)
        try:
            self._makedirs(os.path.dirname(path))
            fd, held = _lock(fcntl, path, wait_s)
        except OSError as exc:  # e.g. ENOLCK on a network file system
            self._problem(f"lock {path}", exc)
            yield False
            return
        try:
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


#: Entry header: magic, key, HMAC-SHA256 of key and body (v2: the key binds an entry to its
#: name; v3: a MAC under a secret instead of a checksum anyone could compute).
_MAGIC = b"portable-guided-grammar-v3"


def _make_key(**parts: Any) -> str:
    text = "\0".join(f"{k}={parts[k]}" for k in sorted(parts))
    return hashlib.sha256(text.encode()).hexdigest()


def _directory_secret(directory: str, check: Callable[[str, os.stat_result], None],
                      shared: bool) -> bytes:
    """The secret kept in ``directory/secret``, made (mode 0600) when absent: written to a
    temporary file and linked into place, so processes racing to make it all read the one
    that won. ``check`` raises on a file that must not be trusted; unless ``shared``, one
    that its group or others can read is refused too."""
    path = os.path.join(directory, "secret")
    for _ in range(50):
        try:
            fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0)
                         | getattr(os, "O_NOFOLLOW", 0))
        except FileNotFoundError:
            _make_secret(directory, path)
            continue
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                raise UnsafeCachePath(f"{path} is not a regular file (mode {oct(st.st_mode)})")
            check(path, st)
            if st.st_mode & 0o077 and not shared:
                raise UnsafeCachePath(f"{path} is readable by group or others (mode "
                                      f"{oct(stat.S_IMODE(st.st_mode))}); not used")
            data = os.read(fd, 4096).strip()
        finally:
            os.close(fd)
        if len(data) == 64:
            return data
        time.sleep(0.01)  # pragma: no cover - made by a writer without link(): being written
    raise UnsafeCachePath(f"{path} holds no secret of 64 hex digits ({len(data)} bytes)")


def _make_secret(directory: str, path: str) -> None:
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=".secret-", suffix=".tmp")  # mode 0600
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(secrets.token_hex(32).encode() + b"\n")
            fh.flush()
            os.fsync(fh.fileno())
        try:
            os.link(tmp, path)  # fails if another process's secret is already there
        except FileExistsError:
            pass
        except OSError:  # pragma: no cover - a file system without hard links
            with contextlib.suppress(FileExistsError):
                out = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
                with os.fdopen(out, "wb") as fh:  # readers retry until it is complete
                    fh.write(secrets.token_hex(32).encode() + b"\n")
    finally:
        with contextlib.suppress(OSError):
            os.unlink(tmp)


def _names(path: str, fd: int) -> bool:
    """Whether ``path`` still names the file open as ``fd``."""
    try:
        st = os.stat(path, follow_symlinks=False)
    except FileNotFoundError:
        return False
    fst = os.fstat(fd)
    return (st.st_dev, st.st_ino) == (fst.st_dev, fst.st_ino)


def _lock(fcntl: Any, path: str, wait_s: float | None) -> tuple[int, bool]:
    """``(fd, held)``: ``path`` opened (created if absent) and locked within ``wait_s``
    seconds (None: however long it takes), retaken when it was removed meanwhile."""
    deadline = None if wait_s is None else time.monotonic() + wait_s
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | getattr(os, "O_NONBLOCK", 0), 0o600)
        try:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            held = _flock(fcntl, fd, left)
            if not held or _names(path, fd):
                return fd, held
            fcntl.flock(fd, fcntl.LOCK_UN)  # removed by evict() before we locked it: retake
        except BaseException:
            os.close(fd)
            raise
        os.close(fd)


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
