"""The fleet-wide cache of compiled grammars: Redis (docs/cache.md).

Entries are the disk cache's (a header with key and HMAC, then the body) under one secret the
fleet shares, so whoever can write Redis without the secret can only cause misses. On a miss
one process of the fleet compiles (a lock taken with ``SET NX PX``, renewed while it compiles,
released by token on every path, expiring if its holder dies) while the others wait, then
load its entry; a compile that failed or timed out is recorded, authenticated too, with its
error and a TTL, so the other processes fail it at once. Every operation is bounded by a
socket timeout; when Redis is unreachable or slow the cache falls back to the local
directory (or to none) for :attr:`RedisCache.retry_after_s`, then tries Redis again: no
request ever fails because of the cache.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import secrets
import threading
import time
from collections.abc import Iterator
from typing import Any

from .cache import SECRET_ENV, DiskCache, GrammarCache, _check_secret, pack_entry, unpack_entry

__all__ = ["RedisCache"]

log = logging.getLogger(__name__)

# Release / renew a lock only while it still holds our token (it may have expired and been
# taken by another process meanwhile).
_RELEASE = "if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('del', KEYS[1]) " \
           "else return 0 end"
_RENEW = "if redis.call('get', KEYS[1]) == ARGV[1] then " \
         "return redis.call('pexpire', KEYS[1], ARGV[2]) else return 0 end"


class RedisCache(GrammarCache):
    """Compiled grammars in Redis, shared by every process of a fleet, over an optional local
    :class:`DiskCache` (read first, written on each hit and compile, used alone while Redis
    is down).

    ``url``: ``redis://host:port/db`` (``rediss://`` for TLS, ``unix://`` for a socket);
    ``secret``: the fleet's secret (default ``$PORTABLE_GUIDED_CACHE_SECRET``; required: a
    secret kept in Redis would protect nothing from who can write Redis); ``timeout_s``
    bounds each Redis call (connect and reply); ``lock_ttl_s``: a compile's lock expires
    this long after its holder stops renewing it (it died); ``entry_ttl_s``: entries expire
    (Redis' own ``maxmemory`` policy bounds its memory); ``retry_after_s``: after a failed
    call, Redis is left alone this long.

    >>> cache = RedisCache("redis://10.0.0.5:6379/0", secret="shared-by-the-fleet-0123",
    ...                    local=DiskCache("/var/cache/pg"))  # doctest: +SKIP
    """

    def __init__(self, url: str, *, secret: bytes | str | None = None,
                 local: DiskCache | None = None, prefix: str = "portable-guided:",
                 timeout_s: float = 0.5, lock_ttl_s: float = 10.0,
                 entry_ttl_s: float = 7 * 86400.0, retry_after_s: float = 5.0,
                 poll_s: float = 0.05) -> None:
        super().__init__()
        if not isinstance(url, str) or not url.startswith(("redis://", "rediss://", "unix://")):
            raise ValueError(f"the cache URL must start with redis://, rediss:// or unix://, "
                             f"got {url!r}")
        for name, value in (("timeout_s", timeout_s), ("lock_ttl_s", lock_ttl_s),
                            ("entry_ttl_s", entry_ttl_s), ("poll_s", poll_s)):
            if not value > 0:
                raise ValueError(f"{name} must be > 0, got {value!r}")
        key = _check_secret(secret) or _check_secret(os.environ.get(SECRET_ENV) or None)
        if key is None:
            raise ValueError(f"a Redis cache needs the fleet's secret: set {SECRET_ENV} (at "
                             f"least 16 bytes, the same on every host) or pass secret=")
        try:
            import redis
            from redis.backoff import NoBackoff
            from redis.retry import Retry
        except ImportError as exc:
            raise ImportError(f"the Redis cache ({url}) needs the redis client: "
                              f"pip install 'portable-guided[redis]'") from exc
        self._secret = key
        self.url = url
        self.local = local
        self.prefix = prefix
        self.timeout_s = float(timeout_s)
        self.lock_ttl_s = float(lock_ttl_s)
        self.entry_ttl_s = float(entry_ttl_s)
        self.retry_after_s = float(retry_after_s)
        self.poll_s = float(poll_s)
        self._errors: tuple[type[BaseException], ...] = (redis.RedisError, OSError)
        # No retries inside the client: one call costs at most ``timeout_s`` (twice: connect,
        # then reply), and a failure sends every caller to the local cache at once.
        self._redis = redis.Redis.from_url(
            url, socket_timeout=timeout_s, socket_connect_timeout=timeout_s,
            retry=Retry(NoBackoff(), 0), retry_on_timeout=False, health_check_interval=0)
        self._release = self._redis.register_script(_RELEASE)
        self._renew = self._redis.register_script(_RENEW)
        self._down_until = 0.0
        self._state_lock = threading.Lock()
        self._outage_warned = False
        self.problems = 0
        self.rejected = 0
        self._warned_rejected = False

    def attach_metrics(self, metrics: Any) -> None:
        """Count this cache's events, and its local directory's, in ``metrics``."""
        super().attach_metrics(metrics)
        if self.local is not None:
            self.local.attach_metrics(metrics)

    # -- health ----------------------------------------------------------------------------
    @property
    def available(self) -> bool:
        """Whether Redis is used now (False for ``retry_after_s`` after a failed call)."""
        return time.monotonic() >= self._down_until

    def _call(self, what: str, fn: Any, *args: Any, always: bool = False, trip: bool = True,
              **kwargs: Any) -> tuple[bool, Any]:
        """``(True, result)`` of a Redis call, or ``(False, None)`` when Redis is down or the
        call failed (then Redis is left alone for ``retry_after_s``). ``always``: tried even
        while Redis is left alone (the lock this process holds); ``trip=False``: a failure
        only returns ``(False, None)``."""
        if not (always or self.available):
            return False, None
        try:
            result = fn(*args, **kwargs)
        except self._errors as exc:
            if trip:
                self._failed(what, exc)
            else:
                log.debug("Redis cache %s: could not %s (%s: %s)", self._where(), what,
                          type(exc).__name__, exc)
            return False, None
        if self._outage_warned:
            with self._state_lock:
                if self._outage_warned:
                    self._outage_warned = False
                    log.info("Redis cache %s answers again", self._where())
        return True, result

    def _failed(self, what: str, exc: BaseException) -> None:
        with self._state_lock:
            self.problems += 1
            self._down_until = time.monotonic() + self.retry_after_s
            first, self._outage_warned = not self._outage_warned, True
        self._count("cache_problems")
        log.log(logging.WARNING if first else logging.DEBUG,
                "Redis cache %s: could not %s (%s: %s); using %s for %g s (no compile fails "
                "for a cache problem)", self._where(), what, type(exc).__name__, exc,
                "the local cache" if self.local is not None else "no shared cache",
                self.retry_after_s)

    def _where(self) -> str:
        return self.url.split("@")[-1]  # no password in logs

    def _reject(self, name: str, data: bytes) -> None:
        self.rejected += 1
        self._count("cache_entries_rejected")
        level = logging.DEBUG if self._warned_rejected else logging.WARNING
        self._warned_rejected = True
        log.log(level, "Redis cache %s: entry %s is corrupted, forged or belongs to another "
                "key (its MAC does not verify: %d bytes, header %r); not loaded, removed",
                self._where(), name, len(data), data.partition(b"\n")[0][:100])
        self._call("remove a rejected entry", self._redis.delete, name)

    # -- entries ---------------------------------------------------------------------------
    def _entry(self, key: str) -> str:
        return f"{self.prefix}g:{key}"

    def get(self, key: str) -> str | None:
        """The text for ``key``: from the local cache, else from Redis (then kept locally)."""
        if self.local is not None:
            text = self.local.get(key)
            if text is not None:
                return text
        ok, data = self._call("read an entry", self._redis.get, self._entry(key))
        if not ok or data is None:
            return None
        text = unpack_entry(self._secret, key, data)
        if text is None:
            self._reject(self._entry(key), data)
            return None
        if self.local is not None:
            self.local.put(key, text)
        return text

    def put(self, key: str, text: str) -> bool:
        """Store ``text`` in Redis and locally; returns whether one of them stored it."""
        stored = self.local.put(key, text) if self.local is not None else False
        ok, _ = self._call("write an entry", self._redis.set, self._entry(key),
                           pack_entry(self._secret, key, text),
                           px=int(self.entry_ttl_s * 1000))
        return ok or stored

    def remove(self, key: str) -> None:
        """Remove ``key``'s entry from Redis and locally."""
        if self.local is not None:
            self.local.remove(key)
        self._call("remove an entry", self._redis.delete, self._entry(key))

    # -- failures --------------------------------------------------------------------------
    def failure(self, key: str) -> tuple[str, str] | None:
        """The failure another process recorded for ``key`` (authenticated), or None."""
        name = f"{self.prefix}f:{key}"
        ok, data = self._call("read a failure", self._redis.get, name)
        if not ok or data is None:
            return None
        text = unpack_entry(self._secret, "f:" + key, data)
        try:
            record: Any = json.loads(text) if text is not None else None
            kind, message, until = record["type"], record["message"], float(record["until"])
        except (ValueError, TypeError, KeyError):
            self._reject(name, data)
            return None
        if until < time.time():  # a valid record replayed past its TTL: not a failure now
            return None
        return str(kind), str(message)

    def put_failure(self, key: str, kind: str, message: str, ttl_s: float) -> None:
        """Record a failed compile of ``key`` for ``ttl_s`` seconds, for the whole fleet."""
        if ttl_s <= 0:
            return
        # The expiry is inside the MAC: a record copied back after its TTL is ignored.
        body = json.dumps({"type": kind, "message": message, "until": time.time() + ttl_s})
        self._call("record a failure", self._redis.set, f"{self.prefix}f:{key}",
                   pack_entry(self._secret, "f:" + key, body), px=max(1, int(ttl_s * 1000)))

    # -- single flight ---------------------------------------------------------------------
    def lock_name(self, key: str) -> str:
        """The Redis key :meth:`single_flight` locks for ``key``."""
        return f"{self.prefix}l:{key}"

    @contextlib.contextmanager
    def single_flight(self, key: str, wait_s: float | None = None) -> Iterator[bool]:
        """Hold ``key``'s fleet-wide lock for a compile on a miss; yields whether held.

        Others wait (polling every ``poll_s``, up to ``wait_s`` seconds, default forever)
        until the holder releases it or its lock expires (``lock_ttl_s`` after its holder
        stopped renewing it: it died). While Redis is down, the local directory's lock
        serves (one compile per host), or none.
        """
        deadline = None if wait_s is None else time.monotonic() + wait_s
        name, token = self.lock_name(key), secrets.token_hex(16)
        ttl_ms = int(self.lock_ttl_s * 1000)
        held = False
        while True:
            ok, took = self._call("take a lock", self._redis.set, name, token, nx=True,
                                  px=ttl_ms)
            if not ok:  # Redis is down: the local lock, with what is left of the wait
                left = None if deadline is None else max(0.0, deadline - time.monotonic())
                with self._local_flight(key, left) as local_held:
                    yield local_held
                return
            if took:
                held = True
                break
            if deadline is not None and time.monotonic() >= deadline:
                break
            time.sleep(self.poll_s if deadline is None
                       else max(0.0, min(self.poll_s, deadline - time.monotonic())))
        if not held:
            log.warning("Redis cache: waited %.1f s for another process compiling %s; "
                        "compiling here too", wait_s, key[:16])
            yield False
            return
        stop = threading.Event()
        renewer = threading.Thread(target=self._keep, args=(name, token, ttl_ms, stop),
                                   name="pg-cache-lock", daemon=True)
        renewer.start()
        try:
            yield True
        finally:
            stop.set()
            renewer.join(self.timeout_s * 2 + 1)
            self._call("release a lock", self._release, keys=[name], args=[token],
                       always=True)

    def _keep(self, name: str, token: str, ttl_ms: int, stop: threading.Event) -> None:
        """Renew the lock ``name`` while ``stop`` is not set (three times per TTL: a renewal
        that fails, e.g. a reply slowed past the timeout by a busy process, is tried again at
        the next one, and sends no other call to the local cache)."""
        while not stop.wait(self.lock_ttl_s / 3):
            ok, renewed = self._call("renew a lock", self._renew, keys=[name],
                                     args=[token, ttl_ms], always=True, trip=False)
            if ok and not renewed:
                log.warning("Redis cache: the lock of %s expired while compiling it (a pause "
                            "longer than %g s); another process may compile it too",
                            name, self.lock_ttl_s)
                return

    @contextlib.contextmanager
    def _local_flight(self, key: str, wait_s: float | None) -> Iterator[bool]:
        if self.local is None:
            yield False
            return
        with self.local.single_flight(key, wait_s) as held:
            yield held
