"""Keyword groups the front end reads schemas by: the keywords of each instance type, the
counts, the annotations, and every keyword of drafts 4 to 2020-12 (where subschemas are comes
from the one keyword table, :mod:`.dialects`)."""

from __future__ import annotations

from .dialects import (
    DATA_KEYWORDS,
    SCHEMA_LIST_KEYWORDS,
    SCHEMA_MAP_KEYWORDS,
    SUBSCHEMA_KEYWORDS,
)

__all__ = ["ANNOTATIONS"]


# Where subschemas are, from the one keyword table (json_schema/dialects.py).
_SUB = SUBSCHEMA_KEYWORDS
_MAPS = SCHEMA_MAP_KEYWORDS
_LISTS = SCHEMA_LIST_KEYWORDS
_DATA = DATA_KEYWORDS

_TYPES = ("null", "boolean", "object", "array", "string", "number")
_NUMBER_KW = ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf")
_STRING_KW = ("minLength", "maxLength", "pattern", "format")
_ARRAY_KW = ("items", "prefixItems", "minItems", "maxItems", "uniqueItems", "contains",
             "minContains", "maxContains", "unevaluatedItems", "additionalItems")
_OBJECT_KW = ("properties", "patternProperties", "additionalProperties", "required",
              "minProperties", "maxProperties", "propertyNames", "dependentRequired",
              "dependentSchemas", "unevaluatedProperties")
_COUNTS = ("minLength", "maxLength", "minItems", "maxItems", "minProperties", "maxProperties",
           "minContains", "maxContains")
_FAMILY = {**{k: "number" for k in _NUMBER_KW}, **{k: "string" for k in _STRING_KW},
           **{k: "array" for k in _ARRAY_KW}, **{k: "object" for k in _OBJECT_KW}}
_ANNOTATIONS = frozenset(("title", "description", "default", "examples", "$comment",
                          "$schema", "deprecated", "readOnly", "writeOnly", "contentEncoding",
                          "contentMediaType", "contentSchema", "$vocabulary"))

#: Every keyword of JSON Schema drafts 4 to 2020-12; others are unknown (annotations).
_KEYWORDS = frozenset((*_SUB, *_MAPS, *_LISTS, *_DATA, *_FAMILY, *_ANNOTATIONS, "type", "$ref",
                       "$id", "id", "$anchor", "$dynamicAnchor", "$dynamicRef", "$recursiveRef",
                       "$recursiveAnchor", "required", "format"))

#: Keywords that do not constrain (annotations and structure), as the engines' refusals and
#: number ranges read them (``_ANNOTATIONS``, the lowering's, leaves out ``$id``, ``$defs``...).
ANNOTATIONS = frozenset((
    "title", "description", "default", "examples", "$comment", "$schema", "$id", "$anchor",
    "$defs", "definitions", "deprecated", "readOnly", "writeOnly", "contentEncoding",
    "contentMediaType", "contentSchema", "nullable",
))
