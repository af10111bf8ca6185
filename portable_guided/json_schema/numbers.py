"""Number ranges: the bounds of a schema that is only a range (:func:`plain_number_range`),
and the ranges llguidance 1.x builds inexactly (refused by ``refusals.llguidance_unsupported``
or, where values are missing, added beside the range by :func:`llguidance_exact_numbers`)."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from decimal import Decimal
from typing import Any, TypeGuard

from .keywords import ANNOTATIONS
from .walk import map_schemas

__all__ = ["MAX_DECIMAL_PLACES", "decimal_places", "llguidance_exact_numbers",
           "plain_number_range"]


_RANGE_KEYS = frozenset(("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"))


def plain_number_range(node: Mapping[str, Any]) -> dict[str, Decimal] | None:
    """The bounds (``minimum``, ``exclusiveMaximum``...: each a decimal as written) of a
    schema that holds only a type including ``number``, at least one finite numeric bound
    and annotations, so that its numbers are exactly the range; ``None`` for any other."""
    types = node.get("type")
    if not (types == "number" or isinstance(types, list) and "number" in types):
        return None
    if not _RANGE_KEYS & node.keys():
        return None
    for key, value in node.items():
        if key in _RANGE_KEYS:
            if not _is_number(value):
                return None
        elif key != "type" and key not in ANNOTATIONS:
            return None
    # repr: the shortest text of the float, what the schema's author wrote
    return {k: Decimal(repr(node[k])) for k in _RANGE_KEYS if k in node}


#: The most fraction digits of a ``multipleOf`` that :func:`decimal_places` reads.
MAX_DECIMAL_PLACES = 12


def decimal_places(node: Mapping[str, Any]) -> int | None:
    """``k`` where ``node`` is a ``number`` schema whose ``multipleOf`` is ``10**-k`` (0.1,
    0.01, ...: its multiples are the decimals whose digits stop within ``k`` fraction
    digits) beside nothing but a range (:func:`plain_number_range`) and annotations;
    ``None`` for any other.

    >>> decimal_places({"type": "number", "multipleOf": 0.01, "minimum": 0})
    2
    >>> decimal_places({"type": "number", "multipleOf": 0.25}) is None
    True
    """
    types = node.get("type")
    if not (types == "number" or isinstance(types, list) and "number" in types
            and "integer" not in types):
        return None
    step = node.get("multipleOf")
    if type(step) is not float or not math.isfinite(step) or step <= 0:
        return None
    places = -Decimal(repr(step)).adjusted()
    if not 1 <= places <= MAX_DECIMAL_PLACES or Decimal(repr(step)) != Decimal(1).scaleb(
            -places):
        return None
    rest = {k: v for k, v in node.items() if k != "multipleOf"}
    if _RANGE_KEYS & rest.keys():
        return places if plain_number_range(rest) is not None else None
    return places if all(k == "type" or k in ANNOTATIONS for k in rest) else None


def _cut_bound_values(node: Mapping[str, Any]) -> list[float]:
    bounds = plain_number_range(node)  # (a value must meet every keyword: only plain ranges)
    if bounds is None:
        return []
    candidates = []
    for key, sign in (("maximum", 1), ("exclusiveMaximum", 1), ("minimum", -1),
                      ("exclusiveMinimum", -1)):
        if key in bounds and bounds[key] * sign > 0:
            whole, _, frac = format(abs(bounds[key]), "f").partition(".")
            frac = frac.rstrip("0")
            candidates += [sign * Decimal(f"{whole}.{frac[:j]}") for j in range(1, len(frac))]

    def within(v: Decimal) -> bool:
        return all((
            "minimum" not in bounds or v >= bounds["minimum"],
            "exclusiveMinimum" not in bounds or v > bounds["exclusiveMinimum"],
            "maximum" not in bounds or v <= bounds["maximum"],
            "exclusiveMaximum" not in bounds or v < bounds["exclusiveMaximum"]))

    # (a value whose float prints back as other digits is left out: not written as such)
    return sorted({float(v) for v in candidates if within(v) and repr(float(v)) == str(v)})


def _is_number(value: Any) -> TypeGuard[int | float]:
    # (math.isfinite overflows on a huge int, which is finite anyway)
    return type(value) is int or type(value) is float and math.isfinite(value)


def _is_integral(value: float) -> bool:
    return type(value) is int or value.is_integer()


def _llguidance_range_hole(low: tuple[float, bool], high: tuple[float, bool]) -> bool:
    (lo, lo_exclusive), (hi, hi_exclusive) = low, high
    if lo_exclusive and lo >= 0 and _is_integral(lo) and lo < hi < lo + 1:
        return True
    if hi_exclusive and hi < 0 and _is_integral(hi) and hi - 1 < lo < hi:
        return True
    return hi_exclusive and hi == 0 and -1 < lo < 0


def llguidance_exact_numbers(schema: Any, text: str) -> str:
    """The schema text (``schema`` parsed) with each ``number`` range written so llguidance
    accepts all of it: its range for a bound with a fraction leaves out the numbers whose
    digits stop inside the bound's (``56.5`` under ``maximum: 56.52``, ``-0.5`` above
    ``minimum: -0.5688``; ``rx_float_range``'s ``lexi_0_to_x``), so those values are added
    beside it as an ``enum`` (each within every keyword of the range: exact). ``text``
    itself where there is none."""
    if '"minimum"' not in text and '"maximum"' not in text and '"exclusiveM' not in text:
        return text
    added = False

    def widen(node: Mapping[str, Any]) -> Any:
        nonlocal added
        values = _cut_bound_values(node)
        if not values:
            return node
        added = True
        return {"anyOf": [node, {"enum": values}]}

    out = map_schemas(schema, widen)
    return json.dumps(out) if added else text
