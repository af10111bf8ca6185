"""Spec validation: rejected before compiling, with the reason and the JSON pointer."""

from __future__ import annotations

import pytest

from portable_guided.runtime import GrammarSpec, GrammarSpecError, specs


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


# -- the meta-schema check at build time: quick, or left to the compile job ------------------
@pytest.fixture
def full_checks(monkeypatch):
    """Counts the full meta-schema checks: each ends in one ``best_match`` over the errors
    ``jsonschema`` finds (the full walk, seconds for a large schema)."""
    exceptions = pytest.importorskip("jsonschema.exceptions")
    calls = []
    best_match = exceptions.best_match

    def counting(errors, *args, **kwargs):
        calls.append(errors)
        return best_match(errors, *args, **kwargs)

    monkeypatch.setattr(exceptions, "best_match", counting)
    return calls


# The shapes that blocked the caller for seconds just under DEFER_CHECK_ABOVE_CHARS (3.6 s,
# 1.7 s and 1.0 s of jsonschema on a 2-core VM): an anyOf of 21,000 {}, nested items, many
# properties.
BIG_PROVEN = {
    "anyOf of {}": {"anyOf": [{} for _ in range(21_000)]},
    "nested items": {"type": "array", "items": {"anyOf": [{"items": {}} for _ in range(4_900)]}},
    "properties": {"type": "object", "properties": {f"p{i}": {} for i in range(5_900)}},
}


@pytest.mark.parametrize("schema", BIG_PROVEN.values(), ids=BIG_PROVEN.keys())
def test_schema_proven_valid_skips_the_full_check(schema, full_checks):
    spec = GrammarSpec.json_schema(schema)
    assert len(spec.text) <= specs.DEFER_CHECK_ABOVE_CHARS  # the size that was checked inline
    assert full_checks == [] and not spec.deferred_check


def test_tag_schema_proven_valid_skips_the_full_check(full_checks):
    tag = {"begin": "<f>", "schema": BIG_PROVEN["anyOf of {}"], "end": "</f>"}
    GrammarSpec.structural_tag([tag], ["<f"])
    assert full_checks == []


def test_invalid_schema_still_refused_at_build_with_the_full_check_message(full_checks):
    # The quick proof never answers for an invalid schema: the full check runs, as before
    # (a small schema: a large one it cannot prove is checked in the compile job).
    schema = {"anyOf": [*({} for _ in range(100)), {"type": "strng"}]}
    with pytest.raises(GrammarSpecError) as info:
        GrammarSpec.json_schema(schema)
    assert len(full_checks) == 1
    assert info.value.pointer == "/anyOf/100/type"
    assert str(info.value) == ("invalid JSON schema: 'strng' is not valid under any of the "
                               "given schemas at /anyOf/100/type")
    with pytest.raises(GrammarSpecError, match="'strng'") as tag_info:
        GrammarSpec.structural_tag([{"begin": "<f>", "schema": schema, "end": "</f>"}], ["<f"])
    assert tag_info.value.pointer == "/tags/0/schema/anyOf/100/type"


def test_small_unproven_schema_is_checked_at_build(full_checks):
    # patternProperties is a keyword the quick proof leaves to the full check.
    with pytest.raises(GrammarSpecError) as info:
        GrammarSpec.json_schema({"patternProperties": {"^x": {"type": "strng"}}})
    assert info.value.pointer == "/patternProperties/^x/type"
    assert len(full_checks) == 1


def test_large_unproven_schema_is_checked_in_compile_job(full_checks):
    # Not proven (draft 2019-09: the proof has no table for it) and too large to check
    # quickly: the full check (up to about 0.2 ms of jsonschema per JSON value) is left to
    # the compile job, where an invalid schema fails with the message and pointer the build
    # would have raised.
    n = 1_000
    bad = {"$schema": "https://json-schema.org/draft/2019-09/schema",
           "anyOf": [*({} for _ in range(n)), {"type": "strng"}]}
    spec = GrammarSpec.json_schema(bad)
    assert spec.deferred_check and full_checks == []
    with pytest.raises(GrammarSpecError) as info:
        spec.run_deferred_check()
    # What building it raised before the check was left to the compile job.
    assert info.value.pointer == f"/anyOf/{n}/type"
    assert str(info.value) == ("invalid JSON schema: 'strng' is not valid under any of the "
                               f"given schemas at /anyOf/{n}/type")
    good = {**bad, "anyOf": bad["anyOf"][:-1]}
    assert GrammarSpec.json_schema(good).deferred_check
    GrammarSpec.json_schema(good).run_deferred_check()
    assert n > specs.DEFER_UNPROVEN_ABOVE_VALUES


def test_large_unproven_invalid_schema_fails_its_request(runtimes):
    props = {f"p{i}": {"type": "string"} for i in range(300)}
    props["p5"] = {"type": "strng"}
    schema = {"type": "object", "properties": props, "patternProperties": {"^x": {}}}
    spec = GrammarSpec.json_schema(schema)
    assert spec.deferred_check
    req = runtimes["xgrammar"].new_request(spec).wait(60)
    assert req.failed and "invalid JSON schema" in str(req.error)
    assert "/properties/p5/type" in str(req.error)
