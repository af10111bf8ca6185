"""A quick proof that a JSON schema is valid against its draft's meta-schema (drafts 4, 6,
7 and 2020-12), for the schemas most requests send, so that the compile job can skip the
full check (``jsonschema``'s meta-schema walk: about 2.7 ms of Python for a small schema,
which was most of a small schema's compile in a worker: bench/bench_vllm.py --cold).

:func:`proves_valid` answers True only when every keyword it meets is one it checks here
exactly as the draft's meta-schema does; anything else (draft 2019-09, a 2020-12 ``$id``, a
keyword with a pattern or a format it does not check, deep nesting) answers False, and the
caller runs the full check. It never answers for an invalid schema: a test compares it with
``jsonschema`` under every draft on every MaskBench and JSON-Schema-Test-Suite schema and on
invalid ones (tests/runtime/test_meta_fast.py).
"""

from __future__ import annotations

from typing import Any

from .dialects import dialect_named

__all__ = ["proves_valid"]

_TYPES = frozenset(("array", "boolean", "integer", "null", "number", "object", "string"))
_MAX_DEPTH = 48


# Keywords by the form of their value in each draft's meta-schema. A keyword a draft's
# table leaves out is an annotation there (the meta-schema ignores it); one mapped to
# "unproven" sends the schema to the full check.
_COMMON = {
    "title": "string", "description": "string", "default": "any", "maximum": "number",
    "minimum": "number", "multipleOf": "positive", "maxLength": "count", "minLength": "count",
    "maxItems": "count", "minItems": "count", "maxProperties": "count",
    "minProperties": "count", "pattern": "string", "uniqueItems": "boolean",
    "required": "names", "definitions": "schema_map", "properties": "schema_map",
    "type": "type", "format": "string", "allOf": "schema_list", "anyOf": "schema_list",
    "oneOf": "schema_list", "not": "schema",
}
_DRAFT6 = {
    **_COMMON, "$id": "string", "$ref": "string", "$schema": "dialect", "examples": "array",
    "exclusiveMaximum": "number", "exclusiveMinimum": "number", "additionalItems": "schema",
    "items": "schema_or_list", "contains": "schema", "additionalProperties": "schema",
    "patternProperties": "schema_map", "dependencies": "dependencies",
    "propertyNames": "schema", "const": "any", "enum": "array",
}
_TABLES = {
    # Draft 4: schemas are objects (a boolean only where the meta-schema says so), integers
    # are not floats, and `required`, `enum` and a dependency's names may not be empty.
    "draft4": {
        **_COMMON, "id": "string", "$schema": "dialect",
        "exclusiveMaximum": "beside_maximum", "exclusiveMinimum": "beside_minimum",
        "additionalItems": "boolean_or_schema", "items": "schema_or_list",
        "additionalProperties": "boolean_or_schema", "patternProperties": "schema_map",
        "dependencies": "dependencies", "enum": "enum4",
    },
    "draft6": _DRAFT6,
    "draft7": {
        **_DRAFT6, "$comment": "string", "readOnly": "boolean", "contentMediaType": "string",
        "contentEncoding": "string", "if": "schema", "then": "schema", "else": "schema",
    },
    "draft2020-12": {
        **_COMMON, "$comment": "string", "$ref": "string", "$schema": "dialect",
        "$defs": "schema_map", "contentMediaType": "string", "contentEncoding": "string",
        "exclusiveMaximum": "number", "exclusiveMinimum": "number", "items": "schema",
        "additionalProperties": "schema", "contains": "schema", "propertyNames": "schema",
        "if": "schema", "then": "schema", "else": "schema", "unevaluatedItems": "schema",
        "unevaluatedProperties": "schema", "contentSchema": "schema",
        "dependentSchemas": "schema_map", "prefixItems": "schema_list", "minContains": "count",
        "maxContains": "count", "deprecated": "boolean", "readOnly": "boolean",
        "writeOnly": "boolean", "const": "any", "examples": "array", "enum": "array",
        "dependentRequired": "dependent_required",
        # In the meta-schema with a pattern or a format these checks do not read.
        **dict.fromkeys(("$id", "$anchor", "$dynamicRef", "$dynamicAnchor", "$vocabulary",
                         "$recursiveRef", "$recursiveAnchor", "dependencies",
                         "patternProperties"), "unproven"),
    },
}


def proves_valid(schema: Any) -> bool:
    """True if ``schema`` (decoded JSON) is certainly valid against the meta-schema of the
    draft its ``$schema`` names (2020-12 without one), the one ``jsonschema`` checks it
    with; False means "not proven" (run the full check), never "invalid".

    >>> proves_valid({"type": "object", "properties": {"a": {"type": "string"}}})
    True
    >>> proves_valid({"type": "text"})
    False
    >>> proves_valid({"$schema": "http://json-schema.org/draft-04/schema#",
    ...               "exclusiveMaximum": True})  # needs maximum in draft 4
    False
    """
    name = "draft2020-12"
    if isinstance(schema, dict) and "$schema" in schema:
        try:
            name = dialect_named(schema["$schema"]).name
        except ValueError:  # (GrammarSpecError) an unknown dialect: the full check says so
            return False
    table = _TABLES.get(name)
    if table is None:
        return False  # draft 2019-09: its meta-schema is not tabled here
    return _valid(schema, 0, table, name == "draft4")


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


def _valid(schema: Any, depth: int, table: dict[str, str], draft4: bool) -> bool:
    if isinstance(schema, bool):
        return not draft4  # (draft 4's schemas are objects)
    if not isinstance(schema, dict) or depth > _MAX_DEPTH:
        return False
    for key, value in schema.items():
        form = table.get(key)
        if form is None:
            continue  # an annotation: the meta-schema does not look at it
        if not _form_ok(form, value, schema, depth, table, draft4):
            return False
    return True


def _form_ok(form: str, value: Any, schema: dict[str, Any], depth: int,
             table: dict[str, str], draft4: bool) -> bool:
    """Whether ``value`` (of a keyword of ``schema``) has ``form`` in the meta-schema."""
    def sub(v: Any) -> bool:
        return _valid(v, depth + 1, table, draft4)

    if form == "schema":
        return sub(value)
    if form == "boolean_or_schema":
        return isinstance(value, bool) or sub(value)
    if form == "schema_map":
        return isinstance(value, dict) and all(sub(v) for v in value.values())
    if form == "schema_list":
        return isinstance(value, list) and bool(value) and all(sub(v) for v in value)
    if form == "schema_or_list":
        return (isinstance(value, list) and bool(value) and all(sub(v) for v in value)
                or not isinstance(value, list) and sub(value))
    if form == "string":
        return isinstance(value, str)
    if form == "number":
        return _number(value)
    if form == "positive":
        return _number(value) and value > 0
    if form == "count":
        return _count(value) and not (draft4 and isinstance(value, float))
    if form == "boolean":
        return isinstance(value, bool)
    if form == "any":
        return True
    if form == "array":
        return isinstance(value, list)
    if form == "type":
        return (value in _TYPES if isinstance(value, str)
                else bool(value) and _unique_strings(value) and all(v in _TYPES for v in value))
    if form == "names":
        return _unique_strings(value) and (bool(value) or not draft4)
    if form == "dependent_required":
        return isinstance(value, dict) and all(_unique_strings(v) for v in value.values())
    if form == "dependencies":
        return isinstance(value, dict) and all(
            _unique_strings(v) and (bool(v) or not draft4) if isinstance(v, list) else sub(v)
            for v in value.values())
    if form.startswith("beside_"):  # draft 4's exclusive bounds: a boolean beside its bound
        return isinstance(value, bool) and form.removeprefix("beside_") in schema
    if form == "enum4":  # draft 4: non-empty and unique (proven for strings only)
        return bool(value) and _unique_strings(value)
    if form == "dialect":
        return depth == 0  # the root's, which chose this table; nested ones: full check
    return False  # "unproven"
