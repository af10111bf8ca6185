"""A quick proof that a JSON schema is valid against the draft 2020-12 meta-schema, for the
schemas most requests send, so that the compile job can skip the full check
(``jsonschema``'s meta-schema walk: about 2.7 ms of Python for a small schema, which was
most of a small schema's compile in a worker: bench/bench_vllm.py --cold).

:func:`proves_valid` answers True only when every keyword it meets is one it checks here
exactly as the meta-schema does; anything else (another dialect named by ``$schema``, an
``$id``, a keyword with a pattern or a format it does not check, deep nesting) answers
False, and the caller runs the full check. It never answers for an invalid schema: a
test compares it with ``jsonschema`` on every MaskBench and JSON-Schema-Test-Suite schema
and on invalid ones (tests/runtime/test_meta_fast.py).
"""

from __future__ import annotations

from typing import Any

__all__ = ["proves_valid"]

_DIALECT = "https://json-schema.org/draft/2020-12/schema"
_TYPES = frozenset(("array", "boolean", "integer", "null", "number", "object", "string"))
_MAX_DEPTH = 48

# Keywords by the form of their value in the 2020-12 meta-schema.
_SCHEMA = frozenset(("items", "additionalProperties", "not", "contains", "propertyNames", "if",
                     "then", "else", "unevaluatedItems", "unevaluatedProperties",
                     "contentSchema"))
_SCHEMA_MAP = frozenset(("properties", "$defs", "definitions", "dependentSchemas"))
_SCHEMA_LIST = frozenset(("allOf", "anyOf", "oneOf", "prefixItems"))  # non-empty
_STRING = frozenset(("description", "title", "$comment", "format", "contentEncoding",
                     "contentMediaType", "pattern", "$ref"))
_NUMBER = frozenset(("maximum", "minimum", "exclusiveMaximum", "exclusiveMinimum"))
_COUNT = frozenset(("minLength", "maxLength", "minItems", "maxItems", "minProperties",
                    "maxProperties", "minContains", "maxContains"))
_BOOLEAN = frozenset(("uniqueItems", "deprecated", "readOnly", "writeOnly"))
_ANY = frozenset(("const", "default"))
_ARRAY = frozenset(("enum", "examples"))
#: Every keyword of the 2020-12 meta-schema (and its deprecated ones): one of these that is
#: not checked above sends the schema to the full check; any other keyword is an annotation
#: the meta-schema ignores.
_KNOWN = frozenset(("$id", "$schema", "$anchor", "$dynamicRef", "$dynamicAnchor",
                    "$vocabulary", "$recursiveRef", "$recursiveAnchor", "dependencies",
                    "patternProperties", "dependentRequired", "required", "type", "multipleOf",
                    *_SCHEMA, *_SCHEMA_MAP, *_SCHEMA_LIST, *_STRING, *_NUMBER, *_COUNT,
                    *_BOOLEAN, *_ANY, *_ARRAY))


def proves_valid(schema: Any) -> bool:
    """True if ``schema`` (decoded JSON) is certainly valid against the draft 2020-12
    meta-schema, the dialect ``jsonschema`` picks for it; False means "not proven" (run the
    full check), never "invalid".

    >>> proves_valid({"type": "object", "properties": {"a": {"type": "string"}}})
    True
    >>> proves_valid({"type": "text"})
    False
    """
    if isinstance(schema, dict) and "$schema" in schema and schema["$schema"] != _DIALECT:
        return False  # another dialect: another meta-schema
    return _valid(schema, 0)


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _count(value: Any) -> bool:
    """The meta-schema's nonNegativeInteger (an integral float counts, a bool does not)."""
    if isinstance(value, bool):
        return False
    if isinstance(value, int):
        return value >= 0
    return isinstance(value, float) and value.is_integer() and value >= 0


def _unique_strings(value: Any) -> bool:
    return (isinstance(value, list) and all(isinstance(v, str) for v in value)
            and len(set(value)) == len(value))


def _valid(schema: Any, depth: int) -> bool:
    if isinstance(schema, bool):
        return True
    if not isinstance(schema, dict) or depth > _MAX_DEPTH:
        return False
    for key, value in schema.items():
        if key not in _KNOWN:
            continue  # an annotation: the meta-schema does not look at it
        if key in _SCHEMA:
            ok = _valid(value, depth + 1)
        elif key in _SCHEMA_MAP:
            ok = isinstance(value, dict) and all(_valid(v, depth + 1) for v in value.values())
        elif key in _SCHEMA_LIST:
            ok = (isinstance(value, list) and bool(value)
                  and all(_valid(v, depth + 1) for v in value))
        elif key in _STRING:
            ok = isinstance(value, str)
        elif key in _NUMBER:
            ok = _number(value)
        elif key in _COUNT:
            ok = _count(value)
        elif key in _BOOLEAN:
            ok = isinstance(value, bool)
        elif key in _ANY:
            ok = True
        elif key in _ARRAY:
            ok = isinstance(value, list)
        elif key == "type":
            ok = (value in _TYPES if isinstance(value, str)
                  else bool(value) and _unique_strings(value)
                  and all(v in _TYPES for v in value))
        elif key == "required":
            ok = _unique_strings(value)
        elif key == "dependentRequired":
            ok = isinstance(value, dict) and all(_unique_strings(v) for v in value.values())
        elif key == "multipleOf":
            ok = _number(value) and value > 0
        elif key == "$schema":
            ok = depth == 0 and value == _DIALECT
        else:  # $id, anchors, dynamic and recursive refs, dependencies, patternProperties
            ok = False
        if not ok:
            return False
    return True
