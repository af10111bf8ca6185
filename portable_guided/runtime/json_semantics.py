"""One JSON-schema language on every engine.

The language of ``GrammarSpec.json_schema(schema)`` is JSON Schema validation, with the
deviations listed in ``docs/runtime.md`` ("JSON schema semantics"), the same whichever engine
compiles it:

- undeclared properties are allowed unless the schema says otherwise
  (``additionalProperties``); ``strict=True`` selects the strict variant, applied to the
  schema itself before any engine sees it (:func:`strict_schema`, as vLLM's
  ``disable_additional_properties``);
- ``oneOf`` is enforced only where its branches are provably disjoint (both engines read it
  as ``anyOf``; ``json_lowering.unsound`` refuses the rest);
- schemas are lowered first into exactly equivalent forms the engines enforce
  (``json_lowering``);
- a keyword an engine would silently ignore makes that engine refuse the schema
  (:func:`xgrammar_unsupported`; llguidance refuses such keywords itself), so ``auto`` falls
  back instead of producing a different language.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator, Mapping
from decimal import Decimal
from typing import Any

from ..json_schema.dialects import (
    DATA_KEYWORDS,
    SCHEMA_LIST_KEYWORDS,
    SCHEMA_MAP_KEYWORDS,
    SUBSCHEMA_KEYWORDS,
)
from ..json_schema.formats import FORMATS
from ..json_schema.pointers import escape_pointer
from ..json_schema.values import has_type
from .json_lowering import value_types
from .xgrammar_patterns import (
    LARGEST_JSON_REPEAT,
    MAX_ESCAPED_MIN_LENGTH,
    exact_pattern,
    largest_repeat,
    needs_escaped_character,
)

__all__ = ["format_unsupported", "length_pattern", "llguidance_exact_numbers",
           "llguidance_unsupported", "map_schemas", "plain_number_range",
           "node_patterns", "strict_schema", "xgrammar_exact_strings", "xgrammar_open_schema", "xgrammar_strict_schema",
           "xgrammar_unsupported"]

# Keywords whose values are subschemas, maps of subschemas, or lists of subschemas (from the
# one keyword table, json_schema/dialects.py; ``items`` may be a list before 2020-12).
_SCHEMA_KEYS = SUBSCHEMA_KEYWORDS
_MAP_KEYS = SCHEMA_MAP_KEYWORDS
_LIST_KEYS = (*SCHEMA_LIST_KEYWORDS, "items")

#: Keywords xgrammar 0.2.8 (non-strict) accepts but does not enforce (checked one by one in
#: tests/runtime/test_json_semantics.py): a schema using them is refused.
XGRAMMAR_IGNORED = ("not", "if", "then", "else", "dependentRequired", "dependencies",
                    "dependentSchemas", "contains", "minContains", "maxContains",
                    "unevaluatedProperties", "allOf", "$dynamicRef", "$recursiveRef")

#: Keywords xgrammar enforces only on a schema that declares its ``type``.
XGRAMMAR_TYPED_ONLY = ("pattern", "minLength", "maxLength", "format", "minimum", "maximum",
                       "exclusiveMinimum", "exclusiveMaximum", "multipleOf", "minItems",
                       "maxItems", "minProperties", "maxProperties", "patternProperties",
                       "propertyNames")

#: Keywords that do not constrain (annotations and structure).
ANNOTATIONS = frozenset((
    "title", "description", "default", "examples", "$comment", "$schema", "$id", "$anchor",
    "$defs", "definitions", "deprecated", "readOnly", "writeOnly", "contentEncoding",
    "contentMediaType", "contentSchema", "nullable",
))

_RANGE_KEYS = frozenset(("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"))


#: The pattern of each format's language (``json_schema.formats``) to its entry: the
#: lowering put it in place of ``format``, and an engine the entry refuses refuses it.
_FORMAT_PATTERNS = {f.pattern: f for f in FORMATS.values() if f.pattern is not None}
#: Whether any format's entry refuses the engine (its patterns are then looked for).
_REFUSING = {e: any(e in f.refused for f in FORMATS.values()) for e in ("xgrammar", "llguidance")}


def iter_schemas(node: Any, pointer: str = "") -> Iterator[tuple[str, Mapping[str, Any]]]:
    """Every (sub)schema object of ``node`` with its JSON pointer (values of ``enum``,
    ``const``, ``default`` and ``examples`` are data, not schemas)."""
    if not isinstance(node, Mapping):
        return
    yield pointer, node
    for key in _SCHEMA_KEYS:
        if isinstance(node.get(key), Mapping):
            yield from iter_schemas(node[key], f"{pointer}/{key}")
    for key in _MAP_KEYS:
        if isinstance(node.get(key), Mapping):
            for name, sub in node[key].items():
                yield from iter_schemas(sub, f"{pointer}/{key}/{_escape(name)}")
    for key in _LIST_KEYS:
        if isinstance(node.get(key), list):
            for i, sub in enumerate(node[key]):
                yield from iter_schemas(sub, f"{pointer}/{key}/{i}")


def node_patterns(node: Mapping[str, Any]) -> list[str]:
    """The regexes of one schema object: its ``pattern`` and its ``patternProperties`` names."""
    patterns = [node["pattern"]] if isinstance(node.get("pattern"), str) else []
    if isinstance(node.get("patternProperties"), Mapping):
        patterns += list(node["patternProperties"])
    return patterns


def format_unsupported(schema: Any, engine: str) -> list[str]:
    """Why ``engine`` would not enforce the formats of the lowered ``schema`` soundly:
    ``"<pointer>: <reason>"`` lines (empty when it can). The lowering put the pattern of our
    language (``json_schema.formats``) in place of each standard ``format`` it could; a
    ``format`` left is one whose language we enforce only as a subset, in a place where the
    schema is negated (``not``, ``if``, a ``oneOf`` branch, ``contains``), or one no engine
    enforces: an engine would apply its own format code (leap seconds anywhere, February
    31, 64-character labels), so it refuses. A format's pattern on an engine its entry
    refuses is refused too."""
    found = []
    for pointer, node in iter_schemas(schema):
        where = pointer or "/"
        fmt = node.get("format")
        entry = FORMATS.get(fmt) if isinstance(fmt, str) else None
        if entry is not None:
            if entry.pattern is None:
                found.append(f"{where}: format {fmt!r} is enforced by no engine")
            else:
                found.append(f"{where}: format {fmt!r} is enforced only as a subset (without "
                             f"{entry.left_out}), which cannot stand where the schema is "
                             "negated (not, if, oneOf, contains)")
        patterns = [node["pattern"]] if isinstance(node.get("pattern"), str) else []
        patterns += [b["pattern"] for b in node.get("allOf") or ()
                     if isinstance(b, Mapping) and isinstance(b.get("pattern"), str)]
        for p in patterns:
            entry = _FORMAT_PATTERNS.get(p)
            if entry is not None and engine in entry.refused:
                found.append(f"{where}: format {entry.name!r} is refused on {engine}: "
                             f"{entry.refused[engine]}")
    return found


def xgrammar_unsupported(schema: Any) -> list[str]:
    """Why xgrammar would not enforce ``schema`` exactly: ``"<pointer>: <reason>"`` lines
    (empty when it can)."""
    found = format_unsupported(schema, "xgrammar")
    for pointer, node in iter_schemas(schema):
        where = pointer or "/"
        for key in XGRAMMAR_IGNORED:
            if key in node:
                found.append(f"{where}: {key} is not enforced by xgrammar")
        if node.get("uniqueItems") is True:
            found.append(f"{where}: uniqueItems is not enforced by xgrammar")
        types = node.get("type")
        types = [types] if isinstance(types, str) else types if isinstance(types, list) else []
        if not types:
            for key in XGRAMMAR_TYPED_ONLY:
                if key in node:
                    found.append(f"{where}: {key} without a type is not enforced by xgrammar")
        if "multipleOf" in node and not (
                types == ["integer"] and isinstance(node["multipleOf"], int)):
            found.append(f"{where}: multipleOf is enforced by xgrammar only as an integer on "
                         "type integer")
        found += [f"{where}: {why}" for why in _xgrammar_node_problems(node, types)]
        if types:
            found += [f"{where}: {why}" for why in _xgrammar_type_beside(node, types, schema)]
    return found


def llguidance_unsupported(schema: Any, text: str) -> list[str]:
    """Why llguidance would not enforce ``schema`` (whose JSON text is ``text``) exactly:
    ``"<pointer>: <reason>"`` lines, empty when it can.

    llguidance 1.x builds a ``number`` range within one integer from an integer lower bound
    as ``L(.fraction)?`` whatever the bound's exclusivity (``rx_float_range``), so it accepts
    ``0`` for ``exclusiveMinimum: 0, maximum: 0.5``. It reaches that form for
    ``exclusiveMinimum: L`` (L >= 0 an integer) with an upper bound below L + 1, for
    ``exclusiveMaximum: -H`` (H an integer) with a lower bound above -H - 1 (it accepts
    ``-H``), and for ``exclusiveMaximum: 0`` with a lower bound in (-1, 0) (``-0``).
    Formats as :func:`format_unsupported` says."""
    found = format_unsupported(schema, "llguidance") if (
        '"format"' in text or _REFUSING["llguidance"]) else []
    if '"exclusiveM' not in text:
        return found
    for pointer, node in iter_schemas(schema):
        types = node.get("type", "number")
        if not (types == "number" or isinstance(types, list) and "number" in types):
            continue
        lows = [(node[k], k == "exclusiveMinimum") for k in ("minimum", "exclusiveMinimum")
                if _is_number(node.get(k))]
        highs = [(node[k], k == "exclusiveMaximum") for k in ("maximum", "exclusiveMaximum")
                 if _is_number(node.get(k))]
        # (every pair: which of two lower bounds llguidance keeps is its own business)
        if any(_llguidance_range_hole(low, high) for low in lows for high in highs):
            found.append(f"{pointer or '/'}: this number range is built inexactly by "
                         "llguidance (it accepts the excluded integer bound)")
    return found


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


def _is_number(value: Any) -> bool:
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


def _xgrammar_type_beside(node: Mapping[str, Any], types: list[Any],
                          root: Any) -> Iterator[str]:
    # xgrammar 0.2.8 ignores `type` beside anyOf, oneOf and $ref (it compiles the branches
    # or the target alone): {"type": "object", "anyOf": [{"type": "integer"}, ...]} accepts
    # 3. Harmless where every branch accepts only types the `type` allows.
    defs = root.get("$defs") if isinstance(root, Mapping) else None
    defs = defs if isinstance(defs, Mapping) else {}
    for key in ("anyOf", "oneOf"):
        branches = node.get(key)
        if isinstance(branches, list):
            for i, branch in enumerate(branches):
                if not _types_within(value_types(branch, defs), types):
                    yield (f"{key} beside type: xgrammar ignores the type, and branch {i} "
                           "may accept other types")
                    break
    if "$ref" in node and not _types_within(value_types({"$ref": node["$ref"]}, defs), types):
        yield "$ref beside type: xgrammar ignores the type, and the target may accept others"


def _types_within(kinds: set[str] | None, types: list[Any]) -> bool:
    """Whether ``kinds`` (:func:`json_lowering.value_types`: numbers as integer and
    fraction) all fall within the declared ``types``."""
    if kinds is None:
        return False
    allowed = {*types, *(("integer", "fraction") if "number" in types else ())}
    return kinds <= allowed


def _xgrammar_node_problems(node: Mapping[str, Any], types: list[Any]) -> Iterator[str]:
    # Each rule below is a case where xgrammar 0.2.8 accepted a different language than
    # JSON Schema's (found by the MaskBench differential, pinned by a test each).
    if "multipleOf" in node and _RANGE_KEYS & node.keys():
        yield "multipleOf beside minimum/maximum: xgrammar ignores the multipleOf"
    if "pattern" in node and ("minLength" in node or "maxLength" in node):
        yield "pattern with minLength/maxLength: xgrammar drops the length bounds"
    if "format" in node and ("minLength" in node or "maxLength" in node):
        yield "format with minLength/maxLength: xgrammar drops the length bounds"
    if "patternProperties" in node and node.get("additionalProperties") is not False:
        yield ("patternProperties with additional properties allowed: xgrammar rejects "
               "names that match no pattern")
    for p in node_patterns(node):
        if largest_repeat(p) > LARGEST_JSON_REPEAT:
            yield (f"pattern {p[:40]!r} repeats more than {LARGEST_JSON_REPEAT} times: "
                   "xgrammar builds that without JSON's string rules (a raw quote, "
                   "backslash or control character inside the string)")
        if needs_escaped_character(p):
            yield (f"pattern {p[:40]!r} needs a backslash or quote, which xgrammar never "
                   "generates inside a string")
        if not (p.startswith("^") and p.endswith("$") and not p.endswith("\\$")):
            yield (f"pattern {p[:40]!r} is not anchored (^...$): JSON Schema searches, "
                   "xgrammar matches the whole string")
    siblings = set(node) - ANNOTATIONS - {"type"}
    for key in ("enum", "const"):
        if key in node and siblings - {key}:
            yield (f"{key} beside {sorted(siblings - {key})[:4]}: xgrammar ignores one or "
                   "the other")
    for key in ("anyOf", "oneOf", "$ref"):
        if key in node and siblings - {key}:
            yield (f"{key} beside {sorted(siblings - {key})[:4]}: xgrammar ignores one or "
                   "the other")
    required = node.get("required")
    if isinstance(required, list) and required:
        props: Mapping[str, Any] = (node["properties"] if isinstance(node.get("properties"),
                                                                      Mapping) else {})
        missing = [r for r in required if r not in props]
        if missing:
            yield f"required {missing[:3]} not among properties: xgrammar ignores them"
    values = node.get("enum") if isinstance(node.get("enum"), list) else (
        [node["const"]] if "const" in node else [])
    if values and types and any(not _has_type(v, types) for v in values):
        yield "enum/const values outside the declared type: xgrammar ignores the type"


_has_type = has_type


def _children_mapped(schema: Mapping[str, Any], fn: Any) -> dict[str, Any]:
    """A copy of ``schema`` with ``fn`` applied to each subschema (data values left alone)."""
    out: dict[str, Any] = {}
    for key, value in schema.items():
        if key in DATA_KEYWORDS:
            out[key] = value
        elif key in _MAP_KEYS and isinstance(value, Mapping):
            out[key] = {k: fn(v) for k, v in value.items()}
        elif key in _SCHEMA_KEYS or key in _LIST_KEYS:
            out[key] = fn(value)
        else:
            out[key] = value
    return out


def map_schemas(schema: Any, fn: Any) -> Any:
    """``schema`` with ``fn`` applied to every subschema object, innermost first (``fn``
    returns the node or its replacement; values of ``enum``, ``const``, ``default`` and
    ``examples`` are data, left alone). Unchanged parts are copied."""
    if isinstance(schema, list):
        return [map_schemas(s, fn) for s in schema]
    if not isinstance(schema, Mapping):
        return schema
    return fn(_children_mapped(schema, lambda child: map_schemas(child, fn)))


def _is_object(s: Mapping[str, Any]) -> bool:
    kind = s.get("type")
    return kind == "object" or (isinstance(kind, list) and "object" in kind) or (
        "properties" in s)


def strict_schema(schema: Any) -> Any:
    """``schema`` with ``"additionalProperties": false`` on every object schema that does not
    say (the strict variant: no undeclared properties); a new object, ``schema`` untouched."""
    if isinstance(schema, list):
        return [strict_schema(s) for s in schema]
    if not isinstance(schema, Mapping):
        return schema
    out = _children_mapped(schema, strict_schema)
    if _is_object(out) and not {"additionalProperties", "patternProperties",
                          "unevaluatedProperties"} & set(out):
        out["additionalProperties"] = False
    return out


def xgrammar_strict_schema(schema: Any) -> Any:
    """``schema`` in the language of xgrammar's ``strict_mode``, which the xgrammar
    backends of SGLang and vLLM compile JSON schemas with (a new object; ``schema`` untouched).

    Checked against xgrammar 0.2.8 (``tests/sglang_plugin/test_sglang_backend.py``,
    ``tests/vllm_plugin/test_vllm_backend033.py``): an object
    schema that names properties (``properties``, ``required``, ``minProperties``,
    ``maxProperties``) and does not say otherwise allows no others; one that names none
    stays any object (SGLang's ``json_object`` response format sends ``{"type": "object"}``);
    ``prefixItems`` without ``items`` allows no further items.
    """
    return _xgrammar_strict_defaults(schema, False)


def xgrammar_open_schema(schema: Any) -> Any:
    """``schema`` with what xgrammar's ``strict_mode`` would close said open explicitly (a
    new object): ``additionalProperties: true`` / ``items: true`` where
    :func:`xgrammar_strict_schema` writes ``false``. xgrammar compiles a structural tag's
    schemas in strict mode, which has no switch; written out, JSON Schema's own defaults
    hold there too."""
    return _xgrammar_strict_defaults(schema, True)


def _xgrammar_strict_defaults(schema: Any, value: bool) -> Any:
    """``schema`` with ``value`` written where xgrammar's ``strict_mode`` closes objects and
    arrays that do not say (see :func:`xgrammar_strict_schema`)."""
    if isinstance(schema, list):
        return [_xgrammar_strict_defaults(s, value) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = _children_mapped(schema, lambda s: _xgrammar_strict_defaults(s, value))
    if (_is_object(out) and not {"additionalProperties", "patternProperties",
                           "unevaluatedProperties"} & out.keys()
            and {"properties", "required", "minProperties", "maxProperties"} & out.keys()):
        out["additionalProperties"] = value
    if "prefixItems" in out and not {"items", "additionalItems", "unevaluatedItems"} & out.keys():
        out["items"] = value
    return out


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


def _length_bounds(node: Mapping[str, Any]) -> tuple[int, int | None] | None:
    """``(minLength, maxLength)`` of a string schema whose only string keywords are these
    (integers), else ``None``."""
    types = node.get("type")
    if not ("minLength" in node or "maxLength" in node) or not (
            types == "string" or isinstance(types, list) and "string" in types):
        return None
    if "pattern" in node or "format" in node:
        return None  # refused on xgrammar instead (it drops the bounds beside these)
    low, high = node.get("minLength", 0), node.get("maxLength")
    if not (type(low) is int and (high is None or type(high) is int and high >= low)):
        return None  # (xgrammar reports minLength above maxLength itself)
    return low, high


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
        lengths = lengths or _length_bounds(node) is not None
    if not lengths and all(exact_pattern(p) == p for p in patterns):
        return schema, []
    bad: list[str] = []

    def exact(text: str) -> str:
        out = exact_pattern(text)
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


_escape = escape_pointer
