"""A lowered schema rewritten into forms xgrammar 0.2.8 builds exactly: ``enum``/``const``
objects and arrays as schemas (:func:`structured_values_text`), string ``pattern``s and
``patternProperties`` names through :mod:`.xgrammar_patterns`, and length bounds up to 128 as
an explicit pattern (:func:`xgrammar_exact_strings`, :func:`length_pattern`)."""

from __future__ import annotations

import functools
import json
import re
import sys
from collections.abc import Iterator, Mapping
from typing import Any

if sys.version_info >= (3, 11):  # Python's regex parser (widths only): re._parser from 3.11
    from re import _constants as _sre_constants  # type: ignore[attr-defined]
    from re import _parser as _sre_parser  # type: ignore[attr-defined]
else:  # pragma: no cover - Python 3.10
    import sre_constants as _sre_constants
    import sre_parse as _sre_parser

from .algebra import _no_inline, _NotExact, merge
from .keywords import _ANNOTATIONS
from .values import has_type
from .walk import _children_mapped, _map_bottom_up, _nodes, iter_schemas, map_schemas, node_patterns
from .xgrammar_patterns import (
    LARGEST_JSON_REPEAT,
    MAX_ESCAPED_MIN_LENGTH,
    PYTHON_SET_OPERATIONS,
    decides_match,
    ends_anchored,
    exact_pattern,
    has_anchor,
    hoisted_anchors,
    top_level_branches,
    unwrapped,
)

__all__ = ["declared_required", "false_refs_inlined", "length_pattern", "lengths_implied", "typed_values", "pattern_with_lengths", "search_pattern", "structured_values_text", "whole_match_pattern",
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


def declared_required(schema: Any) -> Any:
    """``schema`` with each ``required`` name an object does not declare added to its
    ``properties``, as the schema its value already had to match: ``additionalProperties``
    (``{}`` where that is absent or true). The same language (a name's value is checked by
    ``properties`` instead of ``additionalProperties``, which then no longer applies to it),
    written so that xgrammar 0.2.8 enforces the name: it ignores a required name that
    ``properties`` lacks. A name one of the ``patternProperties`` matches gets that
    pattern's schema instead (the value is checked against it either way); where several
    match, or where a pattern cannot be decided on the name (:func:`.decides_match`), the
    object is left as it is. Only on objects typed ``"object"``; not where
    ``unevaluated*`` would see the names this declares. A name no pattern matches beside
    ``additionalProperties: false`` can never be there: the object accepts nothing
    (``false``)."""
    nodes = [node for _, node in iter_schemas(schema)]
    if (not any(_declare_required(node) is not node for node in nodes)
            or any(k.startswith("unevaluated") for node in nodes for k in node)):
        return schema
    return map_schemas(schema, _declare_required)


def false_refs_inlined(schema: Any) -> Any:
    """``schema`` with each ``$ref`` to a definition that is ``false`` replaced by ``false``
    (the referring subschema accepts nothing either: every keyword beside a reference
    applies too), those definitions dropped, and ``false`` taken out of ``anyOf``/``oneOf``
    (it matches nothing, so it counts for no instance; none left: ``false``) and an
    ``allOf`` holding it made ``false``. xgrammar 0.2.8 fails on a ``false`` definition or
    branch ("Schema 'false' cannot accept any value") and reads ``false`` in place (a
    property that must be absent, an array with no item)."""
    defs = schema.get("$defs") if isinstance(schema, dict) else None
    refs = ({f"#/$defs/{name}" for name, d in defs.items() if d is False}
            if isinstance(defs, Mapping) else set())
    if not refs and not any(False in node.get(k, ()) for _, node in iter_schemas(schema)
                            for k in ("anyOf", "oneOf", "allOf")
                            if isinstance(node.get(k), list)):
        return schema

    def inline(node: Mapping[str, Any]) -> Mapping[str, Any] | bool:
        if node.get("$ref") in refs or False in (node.get("allOf") or ()):
            return False
        out = dict(node)
        for key in ("anyOf", "oneOf"):
            if isinstance(out.get(key), list) and False in out[key]:
                out[key] = [b for b in out[key] if b is not False]
                if not out[key]:
                    return False
        return out

    out = map_schemas(schema, inline)
    if isinstance(out, dict) and isinstance(out.get("$defs"), Mapping):
        out["$defs"] = {k: v for k, v in out["$defs"].items() if v is not False}
        if not out["$defs"]:
            del out["$defs"]
    return out


def _declare_required(node: Mapping[str, Any]) -> Mapping[str, Any] | bool:
    required = node.get("required")
    props = node.get("properties", {})
    rest = node.get("additionalProperties", True)
    patterns = node.get("patternProperties", {})
    if (node.get("type") != "object" or not isinstance(required, list)
            or not isinstance(patterns, Mapping) or not isinstance(props, Mapping)
            or not isinstance(rest, (bool, Mapping))):
        return node
    missing = [n for n in dict.fromkeys(required) if isinstance(n, str) and n not in props]
    if not missing:
        return node
    added: dict[str, Any] = {}
    for name in missing:
        decided = [decides_match(p, name) for p in patterns]
        if None in decided or decided.count(True) > 1:
            return node
        if True in decided:
            added[name] = patterns[list(patterns)[decided.index(True)]]
        elif rest is False:
            return False
        else:
            added[name] = dict(rest) if isinstance(rest, Mapping) else {}
    return {**node, "properties": {**props, **added}}


def typed_values(schema: Any) -> Any:
    """``schema`` with each ``enum`` beside a ``type`` left with the values of that type (the
    others were never valid there): the same language, written so that xgrammar 0.2.8, which
    ignores the ``type`` beside an ``enum``, enforces it (``{"type": "string", "enum": [null,
    "a"]}`` is ``"a"`` only). An ``enum`` with no value of its type is left as written (its
    language is empty: refused)."""
    if not any(_typed_values(node) is not node for _, node in iter_schemas(schema)):
        return schema
    return map_schemas(schema, _typed_values)


def _typed_values(node: Mapping[str, Any]) -> Mapping[str, Any]:
    types = node.get("type")
    types = [types] if isinstance(types, str) else types
    values = node.get("enum")
    if not (isinstance(types, list) and types and isinstance(values, list)):
        return node
    kept = [v for v in values if has_type(v, types)]
    return {**node, "enum": kept} if kept and len(kept) < len(values) else node


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


def search_pattern(pattern: str) -> str:
    """JSON Schema's ``pattern`` searches (ECMA-262: a match anywhere in the string);
    xgrammar matches the whole string. The search as a whole-string match, one top-level
    ``|`` branch at a time (a string matches somewhere if one branch does): an unanchored
    side becomes any run of characters written without escapes (what xgrammar's strings
    hold), so ``\\d{3}`` is ``^[^...]*(\\d{3})[^...]*$``; anchors of a group spanning a
    branch count as the branch's (``(^a$)|b`` is ``^((a)|[^...]*(b)[^...]*)$``,
    :func:`.xgrammar_patterns.hoisted_anchors`), and a group spanning the whole pattern is
    read as its content (``(^a|b)``)."""
    branches = top_level_branches(unwrapped(pattern))
    if len(branches) == 1:
        return _searched_branch(pattern)
    # (one pair of anchors around them all: xgrammar warns of each anchor beside a `|`)
    return "^(" + "|".join(_searched_branch(b)[1:-1] for b in branches) + ")$"


def _searched_branch(pattern: str) -> str:
    pattern = hoisted_anchors(pattern)
    start, end = pattern.startswith("^"), ends_anchored(pattern)
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


def whole_match_pattern(pattern: str, low: int, high: int | None) -> str | None:
    """``^(?:pattern)$`` where every match of the ``pattern``, which has no anchor, is
    ``high`` characters long, ``maxLength`` (``[a-zA-Z]{3}`` with ``minLength`` and
    ``maxLength`` 3): a string that long at most holds such a match only as all of it, so the
    search is a whole-string match and the bounds say nothing more. ``None`` otherwise
    (other widths, anchors, syntax Python reads differently from ECMA-262)."""
    if high is None or low > high or _NOT_MEASURED.search(pattern) or has_anchor(pattern):
        return None
    try:
        least, most = _sre_parser.parse(pattern).getwidth()
    except Exception:  # noqa: BLE001 - not read by Python's parser: not certain
        return None
    return f"^(?:{pattern})$" if least == most == high else None


#: Syntax whose meaning differs between Python's ``re`` (which measures the widths below) and
#: ECMA-262: ``{,n}`` (a literal there), ``\A``/``\Z``/``\z``, groups with ``(?``
#: other than ``(?:``, back-references and UTF-16 surrogate escapes; and what Python warns
#: it may read as a set operation some day (:data:`.PYTHON_SET_OPERATIONS`).
_NOT_MEASURED = re.compile("|".join([r"\{,|\\[AZz1-9]|\(\?(?!:)|\\u[dD][89a-fA-F]",
                                     *map(re.escape, PYTHON_SET_OPERATIONS)]))


def lengths_implied(pattern: str, low: int, high: int | None) -> bool:
    """Whether every string that the anchored ``pattern`` (``^...$`` around the whole of
    it) matches is ``low`` to ``high`` characters long (``high`` None: unbounded), so that
    ``minLength``/``maxLength`` beside it decide nothing (``^[A-Z]{2}$`` with ``maxLength:
    255``). False where that is not certain (an unanchored pattern, a top-level ``|``,
    syntax Python reads differently from ECMA-262)."""
    if _NOT_MEASURED.search(pattern):
        return False
    try:
        parsed = _sre_parser.parse(pattern)
        first: Any = parsed[0]
        last: Any = parsed[-1]
        least, most = parsed.getwidth()
    except Exception:  # noqa: BLE001 - not read by Python's parser: not certain
        return False
    at = _sre_constants.AT
    if first != (at, _sre_constants.AT_BEGINNING) or last != (at, _sre_constants.AT_END):
        return False
    unbounded = most >= _sre_constants.MAXREPEAT - 1
    return least >= low and (high is None or not unbounded and most <= high)


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

    - every ``pattern`` and ``patternProperties`` name as the whole-string match of its
      search (:func:`search_pattern`) passed through ``xgrammar_patterns.exact_pattern``
      (xgrammar matches a name's regex against the name's JSON text, where the search's
      filler allows no escape: a subset, as in every string xgrammar writes);
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

    def exact(text: str) -> str:
        out = exact_pattern(search_pattern(text))
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
        whole = None if beside is None else whole_match_pattern(out["pattern"], *beside)
        if whole is not None:
            out["pattern"] = whole
        if beside is not None and (whole is not None or lengths_implied(out["pattern"], *beside)):
            out.pop("minLength", None)
            out.pop("maxLength", None)
            beside = None
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
                key = exact(name)
                if key in names:
                    bad.append(name)
                names[key] = sub
            out["patternProperties"] = names
        return out

    return walk(schema), bad
