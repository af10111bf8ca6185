"""The mutation probe (``portable_guided.harness.mutation``): what it generates, and that it
finds an engine that ignores a keyword (the full run: ``bench/json_mutation_probe.py``)."""

from __future__ import annotations

import json

from portable_guided.harness import mutation
from portable_guided.harness.mutation import mutations, probe_engine


def test_mutations_change_one_place_each_and_spread_over_places():
    instance = {"a": [1, "x"], "b": {"c": None}}
    out = mutations(instance, 200)
    texts = [json.dumps(m, sort_keys=True) for m in out]
    assert len(set(texts)) == len(texts) and json.dumps(instance, sort_keys=True) not in texts
    # Every place is changed: the whole, each property, each item, the nested value.
    for expected in (0, {"a": [1, "x"], "b": {"c": None}, "pg_probe": 1},
                     {"a": 0, "b": {"c": None}}, {"a": [1, "x"], "b": 0},
                     {"a": [1.5, "x"], "b": {"c": None}}, {"a": [1, 0], "b": {"c": None}},
                     {"a": [1, "x"], "b": {"c": "x"}}, {"b": {"c": None}},
                     {"a": [1, "x", "x"], "b": {"c": None}}, {"a": [2, "x"], "b": {"c": None}}):
        assert json.dumps(expected, sort_keys=True) in texts, expected
    # A limit takes the first change of every place before a second of any.
    first = mutations(instance, 6)
    assert len(first) == 6 and first[0] == 0 and first[1] == {"a": 0, "b": {"c": None}}


def _records():
    # The shape xgrammar read without its `type` (untyped definitions that refer to
    # themselves stay references): 3 and "x" were accepted for an object schema.
    defs = {"a": {"properties": {"k": {"const": "a"}, "next": {"$ref": "#/$defs/a"}},
                  "required": ["k"]},
            "b": {"properties": {"k": {"const": "b"}, "next": {"$ref": "#/$defs/b"}},
                  "required": ["k"]}}
    return [
        {"id": "type_beside_anyof", "schema": {"type": "object", "anyOf": [
            {"$ref": "#/$defs/a"}, {"$ref": "#/$defs/b"}], "$defs": defs},
         "tests": [{"valid": True, "data": {"k": "a", "next": {"k": "a"}}}]},
        {"id": "plain", "schema": {"type": "object", "properties": {
            "n": {"type": "integer", "minimum": 0}, "s": {"type": "string", "maxLength": 3}},
            "required": ["n"], "additionalProperties": False},
         "tests": [{"valid": True, "data": {"n": 2, "s": "ab"}}]},
    ]


def test_no_engine_accepts_a_changed_instance_the_schema_rejects(deepseek):
    for engine in ("xgrammar", "llguidance"):
        rows = probe_engine(_records(), deepseek, engine, timeout_s=None)
        assert [r["id"] for r in rows] == ["type_beside_anyof", "plain"] or (
            engine == "xgrammar" and [r["id"] for r in rows] == ["plain"]), (engine, rows)
        assert all(r["tried"] >= 10 for r in rows)
        assert [r for r in rows if r["accepted_invalid"]] == [], engine


def test_the_probe_finds_an_engine_that_ignores_a_type(deepseek, monkeypatch):
    # Without the refusal of a `type` beside `anyOf` (json_schema.refusals), xgrammar compiles
    # the schema and the probe finds what it lets through.
    from portable_guided.json_schema import refusals

    monkeypatch.setattr(refusals, "_xgrammar_type_beside", lambda *a: iter(()))
    rows = probe_engine(_records()[:1], deepseek, "xgrammar", timeout_s=None)
    assert rows and rows[0]["accepted_invalid"], rows
    accepted = [json.loads(t) for t in rows[0]["accepted_invalid"]]
    assert all(not mutation.validator(_records()[0]["schema"]).is_valid(a) for a in accepted)
    assert 0 in accepted or "x" in accepted


def test_the_validator_reads_multiple_of_on_the_numbers_as_written():
    # jsonschema divides binary floats (0.5075 / 0.0001 = 5074.999...); the engines and
    # JSON Schema read the decimal numbers.
    small = mutation.validator({"multipleOf": 0.0001})
    assert small.is_valid(0.5075) and not small.is_valid(0.50751)
    three = mutation.validator({"type": "number", "multipleOf": 3})
    assert three.is_valid(9) and three.is_valid(9.0) and three.is_valid(3e300)
    assert not three.is_valid(10) and not three.is_valid(1e308) and not three.is_valid("9")
