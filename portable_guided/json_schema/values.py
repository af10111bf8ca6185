"""JSON values as JSON Schema sees them."""

from __future__ import annotations

import json
from collections.abc import Collection, Mapping
from typing import Any

__all__ = ["has_type"]


def has_type(value: Any, types: Collection[str]) -> bool:
    """Whether the decoded JSON ``value`` is of one of the JSON Schema ``types`` (a number
    with no fractional part is an ``integer``; a bool is never a number).

    >>> has_type(2.0, {"integer"}), has_type(True, ["number"])
    (True, False)
    """
    if isinstance(value, bool):
        return "boolean" in types
    if value is None:
        return "null" in types
    if isinstance(value, (int, float)):
        return "number" in types or ("integer" in types and float(value).is_integer())
    if isinstance(value, str):
        return "string" in types
    if isinstance(value, list):
        return "array" in types
    return "object" in types


def _copy(x: Any) -> Any:
    """A deep copy of a JSON value (dicts and lists rebuilt, other mappings as dicts; the
    rest is immutable): several times faster than ``copy.deepcopy``, which the lowering
    calls on every merge. Inside the lowering every object is then a ``dict``."""
    if isinstance(x, dict):
        return {k: _copy(v) for k, v in x.items()}
    if isinstance(x, list):
        return [_copy(v) for v in x]
    if isinstance(x, (str, int, float)) or x is None:
        return x
    return {k: _copy(v) for k, v in x.items()} if isinstance(x, Mapping) else x


def _same(x: Any, y: Any) -> bool:
    """``_key(x) == _key(y)``, without writing either as JSON."""
    if isinstance(x, bool) or isinstance(y, bool):
        return x is y
    if isinstance(x, dict):
        return isinstance(y, dict) and x.keys() == y.keys() and all(
            _same(v, y[k]) for k, v in x.items())
    if isinstance(x, list):
        return isinstance(y, list) and len(x) == len(y) and all(map(_same, x, y))
    if isinstance(x, (int, float)):
        return isinstance(y, (int, float)) and x == y
    return type(x) is type(y) and x == y


def _key(v: Any) -> str:
    """Identity of a JSON value as JSON Schema compares them (1 == 1.0, True != 1)."""
    def norm(x: Any) -> Any:
        if isinstance(x, bool) or x is None or isinstance(x, str):
            return x
        if isinstance(x, float) and x.is_integer():
            return int(x)
        if isinstance(x, list):
            return [norm(i) for i in x]
        if isinstance(x, dict):
            return {k: norm(i) for k, i in x.items()}
        return x
    return json.dumps(norm(v), sort_keys=True)
