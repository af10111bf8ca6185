"""meta_fast.proves_valid never vouches for a schema the full meta-schema check refuses."""

from __future__ import annotations

import json

import pytest
from runtime_helpers import suite_dir

from portable_guided.runtime.errors import GrammarSpecError
from portable_guided.runtime.meta_fast import proves_valid
from portable_guided.runtime.specs import GrammarSpec

jsonschema = pytest.importorskip("jsonschema")
SUITE = suite_dir()


def full_check_passes(schema: object) -> bool:
    """The runtime's own deferred check (jsonschema against the meta-schema)."""
    try:
        spec = GrammarSpec.json_schema(schema, validate=False)
        spec = GrammarSpec.from_dict({**spec.to_dict(), "deferred_check": True})
        spec.run_deferred_check()
    except (GrammarSpecError, TypeError):  # TypeError: not a schema at all
        return False
    return True


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
    # Another dialect, or keywords not checked here: not proven (the full check decides).
    assert not proves_valid({"$schema": "http://json-schema.org/draft-07/schema#"})
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
