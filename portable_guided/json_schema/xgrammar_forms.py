"""A lowered schema rewritten into forms xgrammar 0.2.8 builds exactly: ``enum``/``const``
objects and arrays as schemas (:func:`structured_values_text`), string ``pattern``s and
``patternProperties`` names through :mod:`.xgrammar_patterns`, and length bounds up to 128 as
an explicit pattern (:func:`xgrammar_exact_strings`, :func:`length_pattern`)."""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Iterator, Mapping
from typing import Any

from .algebra import _no_inline, _NotExact, merge
from .keywords import _ANNOTATIONS
from .walk import _children_mapped, _map_bottom_up, _nodes, iter_schemas, node_patterns
from .xgrammar_patterns import (
    LARGEST_JSON_REPEAT,
    MAX_ESCAPED_MIN_LENGTH,
    exact_pattern,
)

__all__ = ["length_pattern", "pattern_with_lengths", "search_pattern", "structured_values_text",
           "xgrammar_exact_strings"]


@functools.lru_cache(maxsize=256)
def structured_values_text(text: str) -> str:
    """The lowered schema JSON ``text`` with the objects and arrays among its ``enum``/
    ``const`` values written as the schemas that accept just them (each property or item a
    ``const``, nothing else allowed). xgrammar matches such a value as one fixed text, its
    compact JSON, so with whitespace allowed it rejected ``{"a": 1}`` for ``{"const": {"a":
    1}}`` where llguidance accepts it; as schemas, its JSON grammar reads them (property
    order stays the value's). Only for xgrammar: llguidance reads the values as they are
    (and failed on some schemas with many such branches). Not where ``unevaluated*`` would
    see the properties and items this adds."""
    if '"unevaluated' in text or not any(
            isinstance(v, (dict, list)) for v in _enum_values(json.loads(text))):
        return text
    out = _map_bottom_up(json.loads(text), _structured_values)
    return json.dumps(out, ensure_ascii=False, separators=(",", ":"))


def _enum_values(schema: Any) -> Iterator[Any]:
    for node in _nodes(schema):
        if isinstance(node, dict):
            if isinstance(node.get("enum"), list):
                yield from node["enum"]
            if "const" in node:
                yield node["const"]


def _structured_values(s: dict[str, Any]) -> Any:
    """``s`` with object and array ``enum``/``const`` values as schemas (see
    :func:`structured_values_text`), where ``s`` holds nothing else but ``type``."""
    values = s["enum"] if isinstance(s.get("enum"), list) else (
        [s["const"]] if "const" in s else None)
    if values is None or not any(isinstance(v, (dict, list)) for v in values) or (
            set(s) - _ANNOTATIONS - {"enum", "const", "type", "$defs"}) or (
            "enum" in s and "const" in s):
        return s
    scalars = [v for v in values if not isinstance(v, (dict, list))]
    branches: list[Any] = [{"enum": scalars}] if scalars else []
    branches += [_value_schema(v) for v in values if isinstance(v, (dict, list))]
    rest = {k: v for k, v in s.items() if k not in ("enum", "const")}
    try:  # `type` beside: in each branch (xgrammar takes no keyword beside anyOf)
        merged = [m for m in (merge(rest, b, _no_inline) for b in branches) if m is not False]
    except _NotExact:
        return s
    if not merged:
        return s  # (no value of the type: left to the engine as it was)
    return merged[0] if len(merged) == 1 else {"anyOf": merged}


def _value_schema(v: Any) -> dict[str, Any]:
    """The schema accepting exactly the object or array ``v`` (JSON equality)."""
    if not v:
        return {"type": "object" if isinstance(v, dict) else "array",
                "maxProperties" if isinstance(v, dict) else "maxItems": 0}
    def one(x: Any) -> dict[str, Any]:
        return _value_schema(x) if isinstance(x, (dict, list)) else {"const": x}

    if isinstance(v, dict):
        return {"type": "object", "properties": {k: one(x) for k, x in v.items()},
                "required": list(v), "additionalProperties": False}
    return {"type": "array", "prefixItems": [one(x) for x in v], "items": False,
            "minItems": len(v)}


#: A character of a JSON string written as it is (no escape): what a length bound repeats.
_RAW_CHAR = '[^\\x00-\\x1f"\\\\]'


def length_pattern(min_length: int, max_length: int | None) -> str | None:
    """The anchored regex of the strings ``min_length`` to ``max_length`` characters long
    (``None``: unbounded) written without escapes, or ``None`` when the bounds are not
    written as a pattern: every string qualifies, or a count is above
    :data:`.xgrammar_patterns.LARGEST_JSON_REPEAT`. The class is explicit on purpose:
    xgrammar 0.2.8's own length-bounded string lets raw control characters in.

    Larger bounds stay ``minLength``/``maxLength`` (the xgrammar engine corrects the class of
    the rule they build: ``engines.xgrammar.json_char_rule_fixed``): as a pattern, xgrammar
    builds a repeat above 128 as an automaton edge that it walks on every mask, 34 ms per
    token at ``{0,1000}`` against 0.24 ms (``bench/bench_xgrammar_lengths.py``). A
    ``minLength`` up to :data:`.xgrammar_patterns.MAX_ESCAPED_MIN_LENGTH` alone stays too: the
    xgrammar engine puts an exact rule with escapes in its place."""
    if max(min_length, max_length or 0) > LARGEST_JSON_REPEAT:
        return None
    if max_length is None:
        if min_length <= MAX_ESCAPED_MIN_LENGTH:
            return None  # (escapes included: the engine writes its own rule, xgrammar_exact)
        return f"^{_RAW_CHAR}{{{min_length}}}{_RAW_CHAR}*$"
    return f"^{_RAW_CHAR}{{{min_length},{max_length}}}$"


def _ends_anchored(pattern: str) -> bool:
    """Whether ``pattern`` ends with the ``$`` anchor (not an escaped ``\\$``)."""
    body = pattern[:-1]
    return pattern.endswith("$") and (len(body) - len(body.rstrip("\\"))) % 2 == 0


def search_pattern(pattern: str) -> str:
    """JSON Schema's ``pattern`` searches (ECMA-262: a match anywhere in the string);
    xgrammar matches the whole string. The search as a whole-string match: an unanchored
    side becomes any run of characters written without escapes (what xgrammar's strings
    hold), so ``\\d{3}`` is ``^[^...]*(\\d{3})[^...]*$``. Exact for a pattern without a
    top-level ``|``; with one, anchoring the whole alternation where one branch was
    anchored narrows it (``^a|b`` to strings starting with ``a`` or ``b``): a subset, sound."""
    start, end = pattern.startswith("^"), _ends_anchored(pattern)
    if start and end:
        return pattern
    body = pattern[1 if start else 0:len(pattern) - 1 if end else len(pattern)]
    if not body:
        return f"^{_RAW_CHAR}*$"  # (a pattern that matches every string)
    return (f"^{'' if start else _RAW_CHAR + '*'}({body}){'' if end else _RAW_CHAR + '*'}$")


#: An anchored pattern of one character class (or ``.``, ``\d``...) and a repeat.
_ONE_CLASS = re.compile(r"\^(\[(?:\\.|[^\]\\])+\]|\\[dwsDWS]|\.)(\*|\+|\?|\{(\d+)(?:(,)(\d*))?\})?\$")


def pattern_with_lengths(pattern: str, low: int, high: int | None) -> str | None:
    """The anchored pattern of the strings that match ``pattern`` and are ``low`` to
    ``high`` characters long, where ``pattern`` is one class and a repeat
    (``^[a-z0-9_-]+$`` with ``maxLength: 64`` is ``^[a-z0-9_-]{1,64}$``), or ``None``:
    xgrammar drops length bounds beside a pattern, so other shapes are refused there."""
    m = _ONE_CLASS.fullmatch(pattern)
    if m is None:
        return None
    atom, repeat, least, comma, most = m.groups()
    if repeat is None:
        bounds: tuple[int, int | None] = (1, 1)
    elif repeat in ("*", "+", "?"):
        bounds = {"*": (0, None), "+": (1, None), "?": (0, 1)}[repeat]
    else:
        bounds = (int(least), (int(most) if most else None) if comma else int(least))
    lo = max(bounds[0], low)
    his = [h for h in (bounds[1], high) if h is not None]
    hi = min(his) if his else None
    if hi is not None and hi < lo or max(lo, hi or 0) > LARGEST_JSON_REPEAT:
        return None
    return f"^{atom}{{{lo},{'' if hi is None else hi}}}$"


def _bounds(node: Mapping[str, Any]) -> tuple[int, int | None] | None:
    """``(minLength, maxLength)`` where ``node`` has either and both are integers (a missing
    ``maxLength`` is None), else ``None``."""
    if not ("minLength" in node or "maxLength" in node):
        return None
    low, high = node.get("minLength", 0), node.get("maxLength")
    return (low, high) if type(low) is int and (high is None or type(high) is int) else None


def _pattern_lengths(node: Mapping[str, Any]) -> tuple[int, int | None] | None:
    """``(minLength, maxLength)`` beside a ``pattern`` (no ``format``), else ``None``."""
    if not isinstance(node.get("pattern"), str) or "format" in node:
        return None
    return _bounds(node)


def _length_bounds(node: Mapping[str, Any]) -> tuple[int, int | None] | None:
    """``(minLength, maxLength)`` of a string schema whose only string keywords are these
    (integers), else ``None``."""
    types = node.get("type")
    if not (types == "string" or isinstance(types, list) and "string" in types):
        return None
    if "pattern" in node or "format" in node:
        return None  # (beside these: pattern_with_lengths, or refused on xgrammar)
    bounds = _bounds(node)
    if bounds is None or bounds[1] is not None and bounds[1] < bounds[0]:
        return None  # (xgrammar reports minLength above maxLength itself)
    return bounds


def xgrammar_exact_strings(schema: Any) -> tuple[Any, list[str]]:
    """``schema`` with its string keywords in forms xgrammar 0.2.8 builds exactly (a new
    object where one changed, ``schema`` itself otherwise), and the patterns that could not
    be scanned (or that two names of one ``patternProperties`` share once rewritten):

    - every ``pattern`` and ``patternProperties`` name passed through
      ``xgrammar_patterns.exact_pattern``;
    - ``minLength``/``maxLength`` up to 128 as the ``pattern`` of :func:`length_pattern`:
      xgrammar's own length-bounded string lets raw control characters (tab, U+0000-U+001F
      but newline and carriage return) into the string, which is then not JSON. (xgrammar
      generates no escape in either form, so the explicit class loses nothing it had.)
      Larger bounds stay as they are, for the engine to correct (see there)."""
    patterns = []
    lengths = False
    for _, node in iter_schemas(schema):
        patterns += node_patterns(node)
        lengths = lengths or (_length_bounds(node) or _pattern_lengths(node)) is not None
    if not lengths and all(exact_pattern(p) == search_pattern(p) == p for p in patterns):
        return schema, []
    bad: list[str] = []

    def exact(text: str, *, search: bool = True) -> str:
        out = exact_pattern(search_pattern(text) if search else text)
        if out is None:
            bad.append(text)
        return text if out is None else out

    def walk(node: Any) -> Any:
        if isinstance(node, list):
            return [walk(s) for s in node]
        if not isinstance(node, Mapping):
            return node
        out = _children_mapped(node, walk)
        bounds = _length_bounds(out)
        if bounds is not None:
            pattern = length_pattern(*bounds)
            if pattern is not None or bounds == (0, None):
                out.pop("minLength", None)
                out.pop("maxLength", None)
            if pattern is not None:
                out["pattern"] = pattern
        beside = _pattern_lengths(out)
        folded = None if beside is None else pattern_with_lengths(out["pattern"], *beside)
        if folded is not None:
            out.pop("minLength", None)
            out.pop("maxLength", None)
            out["pattern"] = folded
        if isinstance(out.get("pattern"), str):
            out["pattern"] = exact(out["pattern"])
        if isinstance(out.get("patternProperties"), Mapping):
            names: dict[str, Any] = {}
            for name, sub in out["patternProperties"].items():
                # (searched names stay refused: the filler's `"` and `\` would be in the
                # name, which xgrammar mis-escapes)
                key = exact(name, search=False)
                if key in names:
                    bad.append(name)
                names[key] = sub
            out["patternProperties"] = names
        return out

    return walk(schema), bad
