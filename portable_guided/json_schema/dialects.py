"""JSON Schema dialects: which drafts exist here, the ``$schema`` URIs naming them, and one
keyword table saying which draft knows which keyword and in what form.

The table is plain data, read by :mod:`.normalise` (and by tests): ``KEYWORDS[keyword]`` maps
each draft that knows ``keyword`` to the form of its value there. A draft missing from the
entry does not know the keyword: it is an annotation there, asserting nothing.

>>> dialect_of({"$schema": "http://json-schema.org/draft-04/schema#"}).name
'draft4'
>>> KEYWORDS["exclusiveMaximum"]["draft4"], KEYWORDS["exclusiveMaximum"]["draft7"]
('boolean', 'number')
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

__all__ = ["DATA_KEYWORDS", "DIALECTS", "KEYWORDS", "LATEST", "SCHEMA_LIST_KEYWORDS",
           "SCHEMA_MAP_KEYWORDS", "SUBSCHEMA_KEYWORDS", "Dialect", "dialect_of", "dialect_named",
           "form", "keyword_table_markdown"]


@dataclass(frozen=True)
class Dialect:
    """One draft of JSON Schema."""

    #: Short name, as the Test Suite's folders spell it (``draft4`` ... ``draft2020-12``).
    name: str
    #: The canonical ``$schema`` URI (as its meta-schema's ``$id`` spells it).
    uri: str
    #: Order of publication (0 for draft 4): "from draft 6" is ``rank >= 1``.
    rank: int
    #: The ``jsonschema`` validator class of this draft (its meta-schema check).
    validator: str


DIALECTS = (
    Dialect("draft4", "http://json-schema.org/draft-04/schema#", 0, "Draft4Validator"),
    Dialect("draft6", "http://json-schema.org/draft-06/schema#", 1, "Draft6Validator"),
    Dialect("draft7", "http://json-schema.org/draft-07/schema#", 2, "Draft7Validator"),
    Dialect("draft2019-09", "https://json-schema.org/draft/2019-09/schema", 3,
            "Draft201909Validator"),
    Dialect("draft2020-12", "https://json-schema.org/draft/2020-12/schema", 4,
            "Draft202012Validator"),
)
#: The dialect of a schema without ``$schema``, and the one every engine reads.
LATEST = DIALECTS[-1]
_BY_NAME = {d.name: d for d in DIALECTS}

_D4, _D6, _D7, _D19, _D20 = (d.name for d in DIALECTS)
_ALL = (_D4, _D6, _D7, _D19, _D20)
_FROM6 = _ALL[1:]
_FROM7 = _ALL[2:]
_FROM19 = _ALL[3:]


def _same(form_: str, drafts: tuple[str, ...] = _ALL) -> dict[str, str]:
    return dict.fromkeys(drafts, form_)


#: keyword -> {draft: form}. Forms: ``schema`` (one subschema), ``schemas`` (a non-empty
#: list of them), ``schema_map`` (names chosen by the user -> subschemas), ``container`` (a
#: map of subschemas that asserts nothing; references point into it), ``schema_or_list``
#: (``items`` before 2020-12: a list is positional), ``schema_or_names`` (``dependencies``:
#: a subschema or a list of property names per name), ``boolean`` (draft 4's exclusive
#: bounds, read with ``maximum``/``minimum``; ``number`` later), ``id`` / ``anchor`` / ``ref`` /
#: ``recursive_ref`` / ``recursive_anchor`` / ``dynamic_ref`` / ``dynamic_anchor`` (URI
#: keywords), ``data`` (a JSON value that is data, never a schema), ``value`` (a number,
#: string, bool or list of them, nothing to walk), ``annotation`` (asserts nothing),
#: ``content`` (draft 7's ``contentMediaType``/``contentEncoding``: validators may assert them).
KEYWORDS: dict[str, dict[str, str]] = {
    # Core.
    "$schema": _same("value"),
    "id": {_D4: "id"},
    "$id": _same("id", _FROM6),
    "$ref": _same("ref"),  # before 2019-09 its siblings are ignored, $id included
    "$anchor": _same("anchor", _FROM19),
    "$recursiveRef": {_D19: "recursive_ref"},
    "$recursiveAnchor": {_D19: "recursive_anchor"},
    "$dynamicRef": {_D20: "dynamic_ref"},
    "$dynamicAnchor": {_D20: "dynamic_anchor"},
    "$vocabulary": _same("value", _FROM19),
    "$comment": _same("annotation", _FROM7),
    "definitions": _same("container"),  # a keyword to draft 7, still read as one later
    "$defs": _same("container", _FROM19),
    # Applicators.
    "allOf": _same("schemas"),
    "anyOf": _same("schemas"),
    "oneOf": _same("schemas"),
    "not": _same("schema"),
    "if": _same("schema", _FROM7),
    "then": _same("schema", _FROM7),
    "else": _same("schema", _FROM7),
    "properties": _same("schema_map"),
    "patternProperties": _same("schema_map"),
    "additionalProperties": _same("schema"),
    "propertyNames": _same("schema", _FROM6),
    # 2019-09 split it in two, and lets implementations still read it (the Test Suite's
    # optional tests do): read there too, the stricter of the two readings.
    "dependencies": _same("schema_or_names", _ALL[:4]),
    "dependentSchemas": _same("schema_map", _FROM19),
    "dependentRequired": _same("value", _FROM19),
    "items": {**_same("schema_or_list", _ALL[:4]), _D20: "schema"},
    "additionalItems": _same("schema", _ALL[:4]),  # only beside a list of items
    "prefixItems": {_D20: "schemas"},
    "contains": _same("schema", _FROM6),
    "minContains": _same("value", _FROM19),
    "maxContains": _same("value", _FROM19),
    "unevaluatedItems": _same("schema", _FROM19),
    "unevaluatedProperties": _same("schema", _FROM19),
    "contentSchema": _same("schema", _FROM19),
    # Validation.
    "type": _same("value"),
    "enum": _same("data"),
    "const": _same("data", _FROM6),
    "multipleOf": _same("value"),
    "maximum": _same("value"),
    "minimum": _same("value"),
    "exclusiveMaximum": {_D4: "boolean", **_same("number", _FROM6)},
    "exclusiveMinimum": {_D4: "boolean", **_same("number", _FROM6)},
    "maxLength": _same("value"),
    "minLength": _same("value"),
    "pattern": _same("value"),
    "maxItems": _same("value"),
    "minItems": _same("value"),
    "uniqueItems": _same("value"),
    "maxProperties": _same("value"),
    "minProperties": _same("value"),
    "required": _same("value"),
    "format": _same("value"),
    # Annotations.
    "title": _same("annotation"),
    "description": _same("annotation"),
    "default": _same("data"),
    "examples": _same("data", _FROM6),
    "readOnly": _same("annotation", _FROM7),
    "writeOnly": _same("annotation", _FROM7),
    "deprecated": _same("annotation", _FROM19),
    # Draft 7 lets validators assert these (the Test Suite's optional tests do); later
    # drafts make them annotations.
    "contentEncoding": {_D7: "content", **_same("annotation", _FROM19)},
    "contentMediaType": {_D7: "content", **_same("annotation", _FROM19)},
}


def _in_forms(*forms: str, but: tuple[str, ...] = ()) -> tuple[str, ...]:
    """Keywords that take one of ``forms`` in some draft, in the table's order."""
    return tuple(k for k, by_draft in KEYWORDS.items()
                 if k not in but and not set(by_draft.values()).isdisjoint(forms))


# What a walker of schemas (of any draft) needs, read from the table above.
#: Keywords whose value is one subschema (``items`` also a list before 2020-12;
#: ``contentSchema`` only annotates: not walked).
SUBSCHEMA_KEYWORDS = _in_forms("schema", "schema_or_list", but=("contentSchema",))
#: Keywords whose value is a list of subschemas.
SCHEMA_LIST_KEYWORDS = _in_forms("schemas")
#: Keywords whose value maps names (the user's) to subschemas (``dependencies``: or to
#: lists of names).
SCHEMA_MAP_KEYWORDS = _in_forms("schema_map", "container", "schema_or_names")
#: Keywords whose value is data, never a schema.
DATA_KEYWORDS = _in_forms("data")


def keyword_table_markdown() -> str:
    """:data:`KEYWORDS` as markdown: per keyword and draft, the form it takes there (``-``:
    the draft does not know it, so it asserts nothing); pasted into docs/json_schema_keywords.md."""
    rows = ["| keyword | " + " | ".join(d.name.removeprefix("draft") for d in DIALECTS) + " |",
            "|---|" + "---|" * len(DIALECTS)]
    for keyword, by_draft in KEYWORDS.items():
        cells = [by_draft.get(d.name, "-") for d in DIALECTS]
        rows.append(f"| `{keyword}` | " + " | ".join(cells) + " |")
    return "\n".join(rows) + "\n"


def form(keyword: str, dialect: Dialect) -> str | None:
    """The form of ``keyword``'s value in ``dialect``; None where that draft does not know
    it (an annotation there)."""
    entry = KEYWORDS.get(keyword)
    return None if entry is None else entry.get(dialect.name)


def _uri_key(uri: str) -> str:
    """A ``$schema`` URI without what the standard URIs are written with and without:
    the scheme (http or https), an empty fragment and a trailing slash."""
    key = uri.strip()
    for scheme in ("https://", "http://"):
        if key.startswith(scheme):
            key = key[len(scheme):]
            break
    return key.removesuffix("#").removesuffix("/")


_BY_URI = {_uri_key(d.uri): d for d in DIALECTS}


def dialect_named(uri: Any) -> Dialect:
    """The dialect whose ``$schema`` URI is ``uri`` (http or https, with or without the
    empty fragment ``#``); :class:`GrammarSpecError` naming the supported URIs for any
    other value (draft 3 included: never read as another draft)."""
    if isinstance(uri, str):
        found = _BY_URI.get(_uri_key(uri))
        if found is not None:
            return found
    from ..runtime.errors import GrammarSpecError  # here: the runtime imports this module

    known = ", ".join(d.uri for d in DIALECTS)
    raise GrammarSpecError(f"$schema {uri!r:.200} names no supported JSON Schema dialect "
                           f"(supported: {known})", pointer="/$schema")


def dialect_of(schema: Any) -> Dialect:
    """The dialect ``schema``'s ``$schema`` names; draft 2020-12 without one (or for a
    boolean schema).

    >>> dialect_of({"type": "string"}).name
    'draft2020-12'
    """
    if isinstance(schema, Mapping) and "$schema" in schema:
        return dialect_named(schema["$schema"])
    return LATEST


def by_name(name: str) -> Dialect:
    """The dialect called ``name`` (``draft7``, ``draft2019-09`` ...)."""
    try:
        return _BY_NAME[name]
    except KeyError:
        raise ValueError(f"unknown dialect {name!r}; known: {', '.join(_BY_NAME)}") from None
