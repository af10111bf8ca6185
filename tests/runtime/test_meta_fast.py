"""meta_fast.proves_valid never vouches for a schema the full meta-schema check refuses."""

from __future__ import annotations

import json

import pytest
from runtime_helpers import suite_dir

from portable_guided.runtime.meta_fast import proves_valid

jsonschema = pytest.importorskip("jsonschema")
SUITE = suite_dir()


def full_check_passes(schema: object) -> bool:
    """The reference: ``jsonschema``'s validator of the draft the schema declares (2020-12
    without ``$schema``) against its meta-schema, as the runtime's full check runs it (not
    through the runtime, which tries the quick proof first)."""
    if not isinstance(schema, (dict, bool)):
        return False
    uri = schema.get("$schema", "") if isinstance(schema, dict) else ""
    draft = next((d for d, u in DRAFT_URIS.items() if uri.rstrip("#") == u.rstrip("#")),
                 "draft2020-12" if not uri else None)
    if draft is None:
        return False
    cls = VALIDATORS[draft]
    return not any(True for _ in cls(cls.META_SCHEMA).iter_errors(schema))


DRAFT_URIS = {"draft4": "http://json-schema.org/draft-04/schema#",
              "draft6": "http://json-schema.org/draft-06/schema",
              "draft7": "http://json-schema.org/draft-07/schema#",
              "draft2020-12": "https://json-schema.org/draft/2020-12/schema"}
VALIDATORS = {"draft4": jsonschema.Draft4Validator, "draft6": jsonschema.Draft6Validator,
              "draft7": jsonschema.Draft7Validator,
              "draft2020-12": jsonschema.Draft202012Validator}


INVALID = [
    {"type": "text"}, {"type": []}, {"type": ["string", "string"]}, {"type": 3},
    {"minLength": -1}, {"minLength": 1.5}, {"minLength": True}, {"maxItems": "2"},
    {"required": ["a", "a"]}, {"required": "a"}, {"required": [1]},
    {"properties": {"a": 3}}, {"properties": []}, {"$defs": {"x": "string"}},
    {"enum": 3}, {"examples": {}}, {"allOf": []}, {"anyOf": {}}, {"oneOf": [3]},
    {"items": [{"type": "string"}]}, {"additionalProperties": "no"}, {"not": []},
    {"multipleOf": 0}, {"multipleOf": -2}, {"minimum": "0"}, {"maximum": True},
    {"uniqueItems": 1}, {"description": 5}, {"title": None}, {"pattern": 1}, {"format": 2},
    {"$ref": 5}, {"dependentRequired": {"a": ["b", "b"]}}, {"readOnly": "yes"},
    {"properties": {"a": {"properties": {"b": {"type": "nope"}}}}},
    {"$schema": "https://json-schema.org/draft/2020-12/schema", "type": "nope"},
    3, "object", None, [],
]


@pytest.mark.parametrize("schema", INVALID, ids=[json.dumps(s)[:40] for s in INVALID])
def test_invalid_schemas_are_never_proven(schema):
    assert not full_check_passes(schema)
    assert not proves_valid(schema)


def test_common_schemas_are_proven():
    assert proves_valid(True) and proves_valid({})
    assert proves_valid({"type": "object", "properties": {"a": {"type": ["string", "null"]},
                                                          "b": {"enum": [1, "x"]}},
                         "required": ["a"], "additionalProperties": False,
                         "x-vendor": {"type": "not checked: an annotation"}})
    # Keywords not checked here: not proven (the full check decides).
    assert not proves_valid({"$id": "https://example.com/s", "type": "string"})
    assert not proves_valid({"patternProperties": {"^a": {}}})


@pytest.mark.skipif(not SUITE.is_dir(), reason=f"JSON Schema Test Suite not at {SUITE}")
def test_agrees_with_the_full_check_on_real_schemas():
    """Every schema of the JSON Schema Test Suite and of MaskBench (and each with one
    keyword's value broken) it proves valid passes the full check; most real ones are
    proven."""
    from pathlib import Path

    schemas = [g["schema"] for path in sorted(SUITE.glob("*.json"))
               for g in json.loads(path.read_text(encoding="utf-8"))]
    for path in sorted(Path(SUITE.parents[1] / "maskbench").glob("*.jsonl")):
        schemas += [json.loads(line)["schema"] for line in path.open(encoding="utf-8")][:150]
    broken = []
    for schema in schemas:
        if isinstance(schema, dict):
            for key in list(schema)[:3]:
                for bad in (-1, "x", [], {}, True, None):
                    broken.append({**schema, key: bad})
    proven = 0
    for schema in schemas + broken:
        if proves_valid(schema):
            proven += 1
            assert full_check_passes(schema), json.dumps(schema)[:300]
    assert proven > len(schemas) // 2, (proven, len(schemas))

# Valid in 2020-12 (most of them), invalid under the named draft's meta-schema.
INVALID_BY_DRAFT = [
    ("draft4", {"exclusiveMaximum": True}),  # without maximum
    ("draft4", {"minimum": 1, "exclusiveMinimum": 1}),
    ("draft4", {"required": []}), ("draft4", {"enum": []}), ("draft4", {"enum": ["a", "a"]}),
    ("draft4", {"minLength": 1.0}), ("draft4", {"properties": {"a": True}}),
    ("draft4", {"items": True}), ("draft4", {"dependencies": {"a": []}}),
    ("draft4", {"allOf": [True]}), ("draft4", {"not": False}),
    ("draft6", {"exclusiveMaximum": True}), ("draft6", {"items": []}),
    ("draft6", {"dependencies": {"a": ["b", "b"]}}), ("draft6", {"contains": 3}),
    ("draft6", {"$id": 3}), ("draft7", {"if": "x"}), ("draft7", {"readOnly": 1}),
    ("draft7", {"$comment": 1}), ("draft7", {"propertyNames": []}),
    ("draft7", {"patternProperties": {"^a": 3}}),
]


@pytest.mark.parametrize(("draft", "schema"), INVALID_BY_DRAFT,
                         ids=[f"{d}-{json.dumps(s)[:30]}" for d, s in INVALID_BY_DRAFT])
def test_invalid_schemas_of_each_draft_are_never_proven(draft, schema):
    declared = {"$schema": DRAFT_URIS[draft], **schema}
    assert not full_check_passes(declared)
    assert not proves_valid(declared)


def test_each_draft_is_checked_by_its_own_meta_schema():
    d4, d7 = DRAFT_URIS["draft4"], DRAFT_URIS["draft7"]
    # Draft 4's ids, booleans beside their bound, patternProperties: proven.
    assert proves_valid({"$schema": d4, "id": "http://x/y#", "maximum": 3,
                         "exclusiveMaximum": True, "patternProperties": {"^a": {}}})
    assert proves_valid({"$schema": d7, "$id": "x", "items": [{}, True],
                         "additionalItems": False, "if": {}, "then": True})
    # Draft 2019-09 is not tabled: the full check decides.
    assert not proves_valid({"$schema": "https://json-schema.org/draft/2019-09/schema"})
    assert not proves_valid({"$schema": "https://example.com/unknown"})


@pytest.mark.skipif(not SUITE.is_dir(), reason=f"JSON Schema Test Suite not at {SUITE}")
def test_agrees_with_each_drafts_full_check():
    """Each MaskBench schema (and each with one keyword's value broken, at the root or in a
    property) declared as draft 4, 6, 7 and 2020-12: every one proven valid passes that
    draft's full check, and most draft-4 ones are proven."""
    from pathlib import Path

    schemas = []
    for path in sorted(Path(SUITE.parents[1] / "maskbench").glob("*.jsonl")):
        schemas += [json.loads(line)["schema"] for line in path.open(encoding="utf-8")][:60]
    schemas = [s for s in schemas if isinstance(s, dict)]
    variants = list(schemas)
    for schema in schemas:
        for key in list(schema)[:2]:
            for bad in (-1, 1.0, [], True, None, ["a", "a"]):
                variants.append({**schema, key: bad})
        props = schema.get("properties")
        if isinstance(props, dict) and props:
            name = next(iter(props))
            for bad in (True, {"required": []}, {"exclusiveMinimum": True}, {"minItems": 2.0}):
                variants.append({**schema, "properties": {**props, name: bad}})
    proven = {}
    for draft, uri in DRAFT_URIS.items():
        proven[draft] = 0
        for schema in variants:
            declared = {**schema, "$schema": uri}
            if proves_valid(declared):
                proven[draft] += 1
                assert full_check_passes(declared), (draft, json.dumps(declared)[:300])
    assert proven["draft4"] > len(schemas) // 2, (proven, len(schemas))
