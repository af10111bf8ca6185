"""Spec validation: rejected before compiling, with the reason and the JSON pointer."""

from __future__ import annotations

import pytest

from portable_guided.runtime import GrammarSpec, GrammarSpecError


def test_key_is_canonical():
    a = GrammarSpec.json_schema({"type": "object", "properties": {"a": {"type": "string"}}})
    b = GrammarSpec.json_schema('{"type":"object",  "properties": {"a": {"type": "string"}}}')
    assert a.key == b.key and a == b
    # Property order is meaningful (engines emit properties in schema order).
    c = GrammarSpec.json_schema('{"properties": {"a": {"type": "string"}}, "type": "object"}')
    assert c.key != a.key
    assert GrammarSpec.json_schema({"type": "object"}, any_whitespace=False).key != \
        GrammarSpec.json_schema({"type": "object"}).key
    assert GrammarSpec.from_dict(a.to_dict()) == a


def test_invalid_schema_reports_pointer():
    with pytest.raises(GrammarSpecError) as info:
        GrammarSpec.json_schema({"type": "object", "properties": {"age": {"type": "integr"}}})
    assert info.value.pointer == "/properties/age/type"
    assert "integr" in str(info.value)
    with pytest.raises(GrammarSpecError, match="minimum"):
        GrammarSpec.json_schema({"type": "integer", "minimum": "zero"})


def test_remote_ref_is_rejected_never_fetched():
    schema = {"type": "object", "properties": {
        "a": {"$ref": "#/$defs/x"}, "b": {"$ref": "https://example.com/s.json"}},
        "$defs": {"x": {"type": "string"}}}
    with pytest.raises(GrammarSpecError, match="remote \\$ref") as info:
        GrammarSpec.json_schema(schema)
    assert info.value.pointer == "/properties/b/$ref"


def test_bad_inputs():
    with pytest.raises(GrammarSpecError, match="not valid JSON"):
        GrammarSpec.json_schema("{nope")
    with pytest.raises(TypeError, match="got int"):
        GrammarSpec.json_schema(3)  # type: ignore[arg-type]
    with pytest.raises(GrammarSpecError, match="invalid regex .*position"):
        GrammarSpec.regex("a(b")
    GrammarSpec.regex(r"\p{L}+")  # engine-only syntax is left to the engines
    with pytest.raises(GrammarSpecError, match="empty"):
        GrammarSpec.regex("")
    with pytest.raises(GrammarSpecError, match="no rule for its root 'root'"):
        GrammarSpec.ebnf('start ::= "a"')
    with pytest.raises(GrammarSpecError, match="at least one"):
        GrammarSpec.choice([])
    with pytest.raises(TypeError, match="every choice must be a str"):
        GrammarSpec.choice(["a", 1])  # type: ignore[list-item]
    with pytest.raises(GrammarSpecError, match="starts with none of the triggers"):
        GrammarSpec.structural_tag([{"begin": "<x>", "schema": {}, "end": "</x>"}], ["<f"])
    with pytest.raises(GrammarSpecError) as info:
        GrammarSpec.structural_tag(
            [{"begin": "<f>", "schema": {"type": 5}, "end": "</f>"}], ["<f"])
    assert info.value.pointer.startswith("/tags/0/schema")
    with pytest.raises(ValueError, match="unknown spec kind 'xml'"):
        GrammarSpec("xml", "")


def test_large_schema_checked_in_compile_job(runtimes):
    # Validating a huge schema takes seconds: it is deferred to the compile job (under the
    # time limit) instead of blocking the caller, and still reported with its pointer.
    props = {f"p{i}": {"type": "string", "description": "x" * 100} for i in range(700)}
    props["p5"] = {"type": "strng"}
    spec = GrammarSpec.json_schema({"type": "object", "properties": props})
    assert spec.deferred_check
    req = runtimes["xgrammar"].new_request(spec).wait(60)
    assert req.failed and "invalid JSON schema" in str(req.error)
    assert "/properties/p5/type" in str(req.error)
