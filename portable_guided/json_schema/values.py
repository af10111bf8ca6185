"""JSON values as JSON Schema sees them."""

from __future__ import annotations

from collections.abc import Collection
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
