"""One JSON-schema language on every engine.

The language of ``GrammarSpec.json_schema(schema)`` is JSON Schema validation, with the
deviations listed in ``docs/json_schema.md``, the same whichever engine
compiles it:

- undeclared properties are allowed unless the schema says otherwise
  (``additionalProperties``); ``strict=True`` selects the strict variant, applied to the
  schema itself before any engine sees it (:func:`.strict.strict_schema`, as vLLM's
  ``disable_additional_properties``);
- ``oneOf`` is enforced only where its branches are provably disjoint (both engines read it
  as ``anyOf``; :func:`unsound` refuses the rest);
- schemas are lowered first into exactly equivalent forms the engines enforce
  (:mod:`.lowering`);
- a keyword an engine would silently ignore makes that engine refuse the schema
  (:func:`xgrammar_unsupported`; llguidance refuses such keywords itself), so ``auto`` falls
  back instead of producing a different language.

Here: :func:`unsound` lists what neither engine reads as JSON Schema does (``oneOf``
whose branches may overlap, read as ``anyOf``; ``$dynamicRef``; unresolved non-pointer ``$ref``);
:func:`xgrammar_escapes` property names xgrammar 0.2.8 mis-escapes.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from typing import Any

from .algebra import disjoint, merge_type, value_types
from .formats import FORMATS
from .keywords import ANNOTATIONS
from .numbers import _RANGE_KEYS, _is_number, _llguidance_range_hole, decimal_places
from .values import has_type
from .walk import _walk, iter_schemas, node_patterns
from .xgrammar_patterns import (
    LARGEST_JSON_REPEAT,
    interior_anchor,
    largest_repeat,
    may_match,
    names_control_character,
    needs_escaped_character,
    patterns_disjoint,
)

__all__ = ["unsound", "xgrammar_escapes", "format_unsupported", "xgrammar_unsupported",
           "llguidance_unsupported"]


def unsound(schema: Any) -> list[str]:
    """Why neither engine would read ``schema`` (a lowered schema) as JSON Schema does:
    ``"<pointer>: <reason>"`` lines, empty when both can.

    - ``oneOf`` whose branches may overlap: both engines read it as ``anyOf``
      (JSON Schema Test Suite ``oneOf.json`` groups 0, 1, 2, 4, 6, 7, 8, 9);
    - ``$dynamicRef``/``$dynamicAnchor`` (``dynamicRef.json`` group 2: a ``$ref`` to a
      ``$dynamicAnchor``, which the lowering resolves where no ``$dynamicRef`` exists);
    - a ``$ref`` left unresolved that is not a JSON pointer (``anchor.json`` group 0);
    - a ``minProperties`` a repeated property name could meet (:func:`_counts_repeated_names`).
    """
    found = []
    defs = schema.get("$defs") if isinstance(schema, Mapping) else None
    defs = defs if isinstance(defs, Mapping) else {}
    for pointer, node in _walk(schema):
        if not isinstance(node, Mapping):
            continue
        where = pointer or "/"
        branches = node.get("oneOf")
        if isinstance(branches, list):
            context = {k: node[k] for k in ("type", "required") if k in node}
            live = [merge_type(b, context, defs) for b in branches]
            for i in range(len(live)):
                for j in range(i + 1, len(live)):
                    if not disjoint(live[i], live[j], defs):
                        found.append(f"{where}: oneOf branches {i} and {j} may overlap (read "
                                     "as anyOf: an instance matching both would be accepted)")
                        break
                else:
                    continue
                break
        for key in ("$dynamicRef", "$dynamicAnchor", "$recursiveRef", "$recursiveAnchor"):
            if key in node:
                found.append(f"{where}: {key} is not enforced (dynamic scope)")
        ref = node.get("$ref")
        if isinstance(ref, str) and not (ref == "#" or ref.startswith("#/")):
            found.append(f"{where}: $ref {ref[:60]!r} was not resolved")
        if _counts_repeated_names(node):
            found.append(f"{where}: minProperties {node['minProperties']} beyond the required "
                         "names: an engine counts a repeated property name twice, a parser "
                         "keeps one")
    return found


def _counts_repeated_names(node: Mapping[str, Any]) -> bool:
    """Whether a model could meet ``node``'s ``minProperties`` only by repeating a name.

    Both engines count name/value pairs, and the names an object may have beyond its
    declared ones are free strings that may repeat (``{"a": 1, "a": 2}``); JSON parsers keep
    one, so the object the caller validates has fewer properties. Safe: a count of 1 (any
    pair gives one name), a count the required names meet, or an object with declared names
    only (each is written at most once)."""
    count = node.get("minProperties")
    if not _is_number(count) or count < 2:
        return False
    required = node.get("required")
    if isinstance(required, list) and count <= len({r for r in required if isinstance(r, str)}):
        return False
    closed = node.get("additionalProperties") is False and not node.get("patternProperties")
    return not closed


#: Keywords naming properties (:func:`xgrammar_escapes` reads their names). Not
#: ``patternProperties``: its names are regexes, which xgrammar matches against the name's
#: JSON text; those it would match wrongly (a ``\\`` or ``"`` outside a class, a control
#: character) are refused as patterns (:func:`_xgrammar_node_problems`).
_NAMED = frozenset(("properties", "dependentSchemas", "dependentRequired", "required"))


def xgrammar_escapes(schema: Any) -> list[str]:
    """Property names xgrammar 0.2.8 mis-escapes (``"``, ``\\``, control characters): it
    then accepts a value of any type under them (``properties.json`` group 3)."""
    found = []
    for pointer, node in iter_schemas(schema):
        if _NAMED.isdisjoint(node):
            continue  # (most nodes)
        names: list[Any] = []
        for key in ("properties", "dependentSchemas", "dependentRequired"):
            if isinstance(node.get(key), Mapping):
                names += list(node[key])
        if isinstance(node.get("required"), list):
            names += node["required"]
        for name in names:
            if isinstance(name, str) and json.dumps(name, ensure_ascii=False)[1:-1] != name:
                found.append(f"{pointer or '/'}: property name {name[:30]!r} needs escaping "
                             "in JSON, which xgrammar mis-handles")
    return found


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

_IGNORED = frozenset(XGRAMMAR_IGNORED)
_TYPED_ONLY = frozenset(XGRAMMAR_TYPED_ONLY)

#: The pattern of each format's language (``json_schema.formats``) to its entry: the
#: lowering put it in place of ``format``, and an engine the entry refuses refuses it.
_FORMAT_PATTERNS = {f.pattern: f for f in FORMATS.values() if f.pattern is not None}

#: Whether any format's entry refuses the engine (its patterns are then looked for).
_REFUSING = {e: any(e in f.refused for f in FORMATS.values()) for e in ("xgrammar", "llguidance")}


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
        if not _IGNORED.isdisjoint(node):
            found += [f"{where}: {key} is not enforced by xgrammar"
                      for key in XGRAMMAR_IGNORED if key in node]
        if node.get("uniqueItems") is True:
            found.append(f"{where}: uniqueItems is not enforced by xgrammar")
        types = node.get("type")
        types = [types] if isinstance(types, str) else types if isinstance(types, list) else []
        if not types and not _TYPED_ONLY.isdisjoint(node):
            found += [f"{where}: {key} without a type is not enforced by xgrammar"
                      for key in XGRAMMAR_TYPED_ONLY if key in node]
        # (a multipleOf of 10**-k on a number: our rule, runtime/xgrammar_exact.py)
        if "multipleOf" in node and not (types == ["integer"] and (
                isinstance(node["multipleOf"], int) or node["multipleOf"] == 1)) and (
                decimal_places(node) is None):
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


def _names_of_two_schemas(node: Mapping[str, Any]) -> Iterator[str]:
    # JSON Schema checks a name's value against every schema whose name or pattern it
    # matches; xgrammar 0.2.8 against any one of them (`{"ab": "y"}` passed a property
    # `ab` of type string beside patternProperties `^a.*$` of `enum: ["x"]`).
    patterns = node.get("patternProperties")
    if not isinstance(patterns, Mapping) or not patterns:
        return
    props = node.get("properties")
    if not isinstance(props, Mapping):
        props = {}
    for name in props:
        # (one schema for all of them: checking one is checking all)
        matched = [p for p in patterns if may_match(p, name) and patterns[p] != props[name]]
        if matched:
            yield (f"property {name[:30]!r} matches patternProperties {matched[0][:30]!r}: "
                   "xgrammar checks its value against one schema, not both")
            return
    for i, first in enumerate(patterns):
        for second in list(patterns)[i + 1:]:
            if not patterns_disjoint(first, second):
                yield (f"patternProperties {first[:30]!r} and {second[:30]!r} may match one "
                       "name: xgrammar checks its value against one schema, not both")
                return


def _xgrammar_node_problems(node: Mapping[str, Any], types: list[Any]) -> Iterator[str]:
    # Each rule below is a case where xgrammar 0.2.8 accepted a different language than
    # JSON Schema's (found by the MaskBench differential, pinned by a test each).
    # (every integer is a multiple of 1: xgrammar ignoring it beside a range loses nothing)
    if "multipleOf" in node and _RANGE_KEYS & node.keys() and decimal_places(node) is None and (
            not (types == ["integer"] and node["multipleOf"] == 1)):
        yield "multipleOf beside minimum/maximum: xgrammar ignores the multipleOf"
    if "pattern" in node and ("minLength" in node or "maxLength" in node):
        yield "pattern with minLength/maxLength: xgrammar drops the length bounds"
    if "format" in node and ("minLength" in node or "maxLength" in node):
        yield "format with minLength/maxLength: xgrammar drops the length bounds"
    names = node.get("propertyNames")
    if isinstance(names, Mapping) and names.get("type") != "string":
        # xgrammar writes names from this schema: a branch of another type let it write
        # {"aa": 1, 2: 3} (the lowering types it "string" where it says nothing).
        yield "propertyNames not of type string: xgrammar would write unquoted names"
    if "patternProperties" in node and node.get("additionalProperties") is not False:
        yield ("patternProperties with additional properties allowed: xgrammar rejects "
               "names that match no pattern")
    yield from _names_of_two_schemas(node)
    for p in node_patterns(node):
        if largest_repeat(p) > LARGEST_JSON_REPEAT:
            yield (f"pattern {p[:40]!r} repeats more than {LARGEST_JSON_REPEAT} times: "
                   "xgrammar builds that without JSON's string rules (a raw quote, "
                   "backslash or control character inside the string)")
        if needs_escaped_character(p):
            yield (f"pattern {p[:40]!r} needs a backslash or quote, which xgrammar never "
                   "generates inside a string")
        if names_control_character(p):
            yield (f"pattern {p[:40]!r} names a control character, which xgrammar writes "
                   "raw inside a string (not JSON)")
        if interior_anchor(p):
            yield (f"pattern {p[:40]!r} has an anchor inside it, which xgrammar ignores (the "
                   "pattern would match more)")
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
    # (on a node that cannot be an object, `required` says nothing: `{"type": "array",
    # "required": [...]}`, Github_medium o14076)
    if isinstance(required, list) and required and (not types or "object" in types):
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
