"""Which cache of compiled grammars a runtime uses, from arguments or the environment
(docs/cache.md): a local directory, Redis over it, or none."""

from __future__ import annotations

import os

from .cache import SECRET_ENV, SHARED_ENV, DiskCache, GrammarCache
from .errors import GrammarCompileError, GrammarEmptyLanguage, GrammarTimeout

__all__ = ["SECRET_ENV", "SHARED_ENV", "URL_ENV", "open_cache", "shared_failure_error"]

#: Environment variable naming the fleet's Redis (``redis://host:port/db``).
URL_ENV = "PORTABLE_GUIDED_CACHE_URL"

_KINDS: dict[str, type[GrammarCompileError]] = {
    cls.__name__: cls for cls in (GrammarCompileError, GrammarTimeout, GrammarEmptyLanguage)}


def open_cache(directory: str | os.PathLike[str] | None = None, *, url: str | None = None,
               secret: bytes | str | None = None,
               shared: bool | None = None) -> GrammarCache | None:
    """The cache for ``directory`` (a :class:`DiskCache`) and ``url`` (a ``RedisCache`` over
    it), or None for neither. Unset arguments come from ``$PORTABLE_GUIDED_CACHE_URL``,
    ``$PORTABLE_GUIDED_CACHE_SECRET`` and ``$PORTABLE_GUIDED_CACHE_SHARED``.

    >>> open_cache(None, url="") is None
    True
    """
    if url is None:
        url = os.environ.get(URL_ENV) or None
    if secret is None:
        secret = os.environ.get(SECRET_ENV) or None
    local = DiskCache(directory, secret=secret, shared=shared) if directory else None
    if not url:
        return local
    from .redis_cache import RedisCache

    return RedisCache(url, secret=secret, local=local)


def shared_failure_error(kind: str, message: str, engine: str) -> GrammarCompileError:
    """The error of a compile another process recorded as failed (its type when known)."""
    error = _KINDS.get(kind, GrammarCompileError)(
        f"{message} (recorded by another process of the fleet; retried after its TTL)")
    error.engine = engine
    return error
