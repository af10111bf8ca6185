"""JSON pointers (RFC 6901): one escape for every part of the front end."""

from __future__ import annotations

from typing import Any

__all__ = ["escape_pointer", "unescape_pointer"]


def escape_pointer(part: Any) -> str:
    """One reference token of a JSON pointer: ``~`` as ``~0``, ``/`` as ``~1``.

    >>> escape_pointer("a/b~c")
    'a~1b~0c'
    """
    return str(part).replace("~", "~0").replace("/", "~1")


def unescape_pointer(token: str) -> str:
    """The name a reference token stands for (the inverse of :func:`escape_pointer`)."""
    return token.replace("~1", "/").replace("~0", "~")
