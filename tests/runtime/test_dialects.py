"""JSON Schema dialects: ``$schema`` URIs, the keyword table, the rewrite of drafts 4, 6, 7
and 2019-09 into 2020-12, and what the engines accept for schemas declaring those drafts.

The independent reference is ``jsonschema``: its validator of the declared draft on the
original schema must agree with its draft 2020-12 validator on the rewritten one, over the
instances of the official JSON Schema Test Suite (and of random small schemas).
"""

from __future__ import annotations

import copy
import glob
import json
import os
import re
import warnings
from pathlib import Path

import pytest
from runtime_helpers import decide_text

from portable_guided.json_schema.dialects import DIALECTS, KEYWORDS, LATEST, by_name, dialect_of
from portable_guided.json_schema.normalise import RECURSIVE_ANCHOR, normalise
from portable_guided.runtime import GrammarSpec, GrammarSpecError

jsonschema = pytest.importorskip("jsonschema")
referencing = pytest.importorskip("referencing")

SUITE = Path(__file__).resolve().parents[1] / "data" / "json-schema-test-suite"
MASKBENCH = Path("/work/shared/data/maskbench")
D4, D6, D7, D19 = (d.uri for d in DIALECTS[:4])
OLD_DRAFTS = ["draft4", "draft6", "draft7", "draft2019-09"]


def norm(schema):
    return normalise(schema, dialect_of(schema))


# -- $schema URIs --------------------------------------------------------------------------
@pytest.mark.parametrize(("uri", "name"), [
    ("http://json-schema.org/draft-04/schema#", "draft4"),
    ("http://json-schema.org/draft-04/schema", "draft4"),
    ("https://json-schema.org/draft-04/schema#", "draft4"),
    ("http://json-schema.org/draft-06/schema#", "draft6"),
    ("http://json-schema.org/draft-07/schema", "draft7"),
    ("https://json-schema.org/draft/2019-09/schema", "draft2019-09"),
    ("https://json-schema.org/draft/2019-09/schema#", "draft2019-09"),
    ("https://json-schema.org/draft/2020-12/schema", "draft2020-12"),
    ("http://json-schema.org/draft/2020-12/schema#", "draft2020-12"),
])
def test_standard_uris(uri, name):
    assert dialect_of({"$schema": uri}).name == name


def test_no_schema_is_2020_12():
    assert dialect_of({"type": "string"}) is LATEST
    assert dialect_of(True) is LATEST


@pytest.mark.parametrize("uri", ["http://json-schema.org/draft-03/schema#",
                                 "http://json-schema.org/schema#", "https://example.com/s",
                                 "", 7, None])
def test_unknown_dialect_refused(uri):
    with pytest.raises(GrammarSpecError) as err:
        GrammarSpec.json_schema({"$schema": uri, "type": "string"})
    assert repr(uri)[:40] in str(err.value) and LATEST.uri in str(err.value)
    with pytest.raises(GrammarSpecError):  # never read as another draft, checked or not
        GrammarSpec.json_schema({"$schema": uri}, validate=False)


@pytest.mark.skipif(not MASKBENCH.is_dir(), reason=f"MaskBench not at {MASKBENCH}")
def test_maskbench_dialects_accepted():
    seen: dict[str, int] = {}
    for path in sorted(glob.glob(str(MASKBENCH / "*.jsonl"))):
        with open(path, encoding="utf-8") as fh:
            for line in fh:
                schema = json.loads(line)["schema"]
                if isinstance(schema, str):
                    schema = json.loads(schema)
                name = dialect_of(schema).name
                seen[name] = seen.get(name, 0) + 1
    assert sum(seen.values()) == 7818
    assert seen == {"draft2020-12": 4496 + 17, "draft4": 2809, "draft7": 343, "draft6": 153}


# -- the keyword table ---------------------------------------------------------------------
#: Keywords read by another one in jsonschema (its validators hold no entry of their own).
_READ_BY_OTHERS = {"then", "else", "minContains", "maxContains"}
_NOT_ASSERTING = {"annotation", "container", "id", "anchor", "dynamic_anchor",
                  "recursive_anchor", "content"}


@pytest.mark.parametrize("dialect", DIALECTS, ids=lambda d: d.name)
def test_keyword_table_matches_jsonschema(dialect):
    # The keywords the table says the draft asserts with are those jsonschema's validator
    # of that draft implements (an independent reading of each draft).
    table = {k for k, forms in KEYWORDS.items()
             if forms.get(dialect.name) not in (None, *_NOT_ASSERTING)}
    table -= {"$schema", "$vocabulary", "default", "examples", "contentSchema"}
    table -= _READ_BY_OTHERS
    if dialect.rank == 0:
        table -= {"exclusiveMaximum", "exclusiveMinimum"}  # read by maximum / minimum
    if dialect.name == "draft2019-09":
        table -= {"dependencies"}  # read for compatibility, as the suite's optional tests do
    assert table == set(getattr(jsonschema, dialect.validator).VALIDATORS)


def _reference(dialect):
    """The ``jsonschema`` validator of ``dialect``; for 2019-09, reading ``dependencies``
    as the suite's optional tests (and the rewrite) do."""
    validator = getattr(jsonschema, dialect.validator)
    if dialect.name != "draft2019-09":
        return validator
    from jsonschema import _legacy_keywords

    return jsonschema.validators.extend(
        validator, {"dependencies": _legacy_keywords.dependencies_draft4_draft6_draft7})


# -- each rewrite --------------------------------------------------------------------------
@pytest.mark.parametrize(("schema", "expected"), [
    ({"$schema": D4, "maximum": 5, "exclusiveMaximum": True}, {"exclusiveMaximum": 5}),
    ({"$schema": D4, "minimum": 1, "exclusiveMinimum": False}, {"minimum": 1}),
    ({"$schema": D4, "exclusiveMinimum": True}, {}),
    ({"$schema": D6, "exclusiveMaximum": 3}, {"exclusiveMaximum": 3}),
    ({"$schema": D7, "items": [{"type": "string"}], "additionalItems": False},
     {"prefixItems": [{"type": "string"}], "items": False}),
    ({"$schema": D7, "items": {"type": "string"}, "additionalItems": False},
     {"items": {"type": "string"}}),
    ({"$schema": D19, "items": [True], "unevaluatedItems": False},
     {"prefixItems": [True], "unevaluatedItems": False}),
    ({"$schema": D4, "dependencies": {"a": ["b"], "c": {"required": ["d"]}}},
     {"dependentRequired": {"a": ["b"]}, "dependentSchemas": {"c": {"required": ["d"]}}}),
    # 2019-09 reads it too (the stricter reading: the Test Suite's optional tests do) ...
    ({"$schema": D19, "dependencies": {"a": ["b"]}}, {"dependentRequired": {"a": ["b"]}}),
    # ... beside its successors, in an allOf branch of its own.
    ({"$schema": D19, "dependentRequired": {"a": ["c"]}, "dependencies": {"a": ["b"]},
      "allOf": [{}]},
     {"dependentRequired": {"a": ["c"]}, "allOf": [{}, {"dependentRequired": {"a": ["b"]}}]}),
    ({"$schema": D4, "id": "http://x/s.json", "type": "string"},
     {"$id": "http://x/s.json", "type": "string"}),
    ({"$schema": D7, "definitions": {"a": {"$id": "#foo", "type": "integer"}}},
     {"definitions": {"a": {"$anchor": "foo", "type": "integer"}}}),
    ({"$schema": D4, "definitions": {"a": {"id": "#/definitions/a", "type": "string"},
                                     "b": {"id": "#b!c"}}},
     {"definitions": {"a": {"type": "string"}, "b": {}}}),  # no 2020-12 anchor: inert
    ({"$schema": D4, "const": 1, "contains": {}, "propertyNames": {}, "if": {},
      "x-note": {"const": 2}}, {"x-note": {"const": 2}}),
    ({"$schema": D7, "$ref": "#/definitions/a", "$id": "http://x/y", "type": "string",
      "definitions": {"a": {}}}, {"$ref": "#/definitions/a", "definitions": {"a": {}}}),
    ({"$schema": D19, "$ref": "#/$defs/a", "type": "string", "$defs": {"a": {}}},
     {"$ref": "#/$defs/a", "type": "string", "$defs": {"a": {}}}),
    ({"$schema": D19, "$id": "http://x/t", "$recursiveAnchor": True,
      "items": {"$recursiveRef": "#"}},
     {"$id": "http://x/t", "$dynamicAnchor": RECURSIVE_ANCHOR,
      "items": {"$dynamicRef": "#" + RECURSIVE_ANCHOR}}),
    ({"$schema": D19, "items": {"$recursiveRef": "#"}}, {"items": {"$ref": "#"}}),
])
def test_rewrite(schema, expected):
    before = copy.deepcopy(schema)
    assert norm(schema) == expected
    assert schema == before  # the input is untouched


def test_data_and_names_are_not_rewritten():
    data = {"items": [1], "exclusiveMaximum": True, "$ref": "#/nowhere", "id": "x"}
    schema = {"$schema": D4, "enum": [data], "default": data,
              "properties": {"items": {"type": "string"}, "dependencies": {},
                             "const": {"maximum": 1, "exclusiveMaximum": True}}}
    out = norm(schema)
    assert out["enum"] == [data] and out["default"] == data
    assert out["properties"] == {"items": {"type": "string"}, "dependencies": {},
                                 "const": {"exclusiveMaximum": 1}}


def test_pointers_follow_what_moved():
    schema = {"$schema": D7, "items": [{"type": "string"}, {"$ref": "#/items/0"}],
              "additionalItems": {"$ref": "#/dependencies/a"},
              "dependencies": {"a": {"$ref": "#/items/1"}}}
    assert norm(schema) == {
        "prefixItems": [{"type": "string"}, {"$ref": "#/prefixItems/0"}],
        "items": {"$ref": "#/dependentSchemas/a"},
        "dependentSchemas": {"a": {"$ref": "#/prefixItems/1"}}}


def test_pointers_follow_under_a_urn_base():
    schema = {"$schema": D7, "$id": "urn:uuid:deadbeef-1234-0000-0000-4321feebdaed",
              "items": [{"type": "string"}], "additionalItems": {"$ref": "#/items/0"}}
    assert norm(schema)["items"] == {"$ref": "#/prefixItems/0"}


@pytest.mark.parametrize("schema", [
    {"$schema": D7, "$ref": "#/if", "if": {"type": "string"}},  # a sibling of $ref
    {"$schema": D6, "if": {"type": "string"}, "properties": {"a": {"$ref": "#/if"}}},
    {"$schema": D4, "items": {"$ref": "#/additionalItems"}, "additionalItems": False},
    {"$schema": D7, "allOf": [{"$ref": "#/definitions/a/items"}],  # under a dropped sibling
     "definitions": {"a": {"$ref": "#", "items": {}}}},
])
def test_pointer_into_what_the_draft_ignores_is_refused(schema):
    with pytest.raises(GrammarSpecError, match="ignores"):
        norm(schema)


def test_ref_beside_id_resolves_against_the_outer_base():
    # Draft 7 ignores the $id beside $ref: "#/definitions/a" is the root's (an integer).
    schema = {"$schema": D7, "$id": "http://x/root.json",
              "definitions": {"a": {"type": "integer"}},
              "properties": {"p": {"$id": "http://y/other.json", "$ref": "#/definitions/a",
                                   "definitions": {"a": {"type": "string"}}}}}
    out = norm(schema)
    assert out["properties"]["p"] == {"$ref": "#/definitions/a",
                                      "definitions": {"a": {"type": "string"}}}
    v = jsonschema.Draft202012Validator(out)
    assert v.is_valid({"p": 1}) and not v.is_valid({"p": "s"})


def test_unsupported_2019_constructs_refused():
    with pytest.raises(GrammarSpecError, match="contains"):
        norm({"$schema": D19, "contains": {}, "unevaluatedItems": False})
    with pytest.raises(GrammarSpecError, match="recursiveRef"):
        norm({"$schema": D19, "$recursiveRef": "#/x"})
    with pytest.raises(GrammarSpecError, match="inside"):
        norm({"$schema": D7, "items": {"$schema": D4, "maximum": 1, "exclusiveMaximum": True}})
    assert norm({"$schema": D7, "items": {"$schema": D4}}) == {"items": {}}  # reads alike
    with pytest.raises(GrammarSpecError, match="contentMediaType"):
        norm({"$schema": D7, "contentMediaType": "application/json"})


# -- against jsonschema, on the official Test Suite ------------------------------------------
def _suite_groups(name):
    files = sorted(glob.glob(str(SUITE / name / "*.json"))
                   + glob.glob(str(SUITE / name / "optional" / "*.json")))
    for path in files:
        with open(path, encoding="utf-8") as fh:
            for i, group in enumerate(json.load(fh)):
                yield f"{os.path.basename(path)}#{i}", group


def _verdict(validator, schema, data):
    try:
        return validator(schema).is_valid(data)
    except (LookupError, ValueError, RecursionError, re.error,  # e.g. ECMAScript-only regexes
            jsonschema.exceptions.SchemaError, referencing.exceptions.Unresolvable) as exc:
        return type(exc).__name__  # no verdict


#: Where the declared draft's data model differs from 2020-12's (not expressible there):
#: draft 4's "integer" excludes 1.0, which equals 1 in later drafts.
_DATA_MODEL = {("draft4", "zeroTerminatedFloats.json#0")}


@pytest.mark.skipif(not SUITE.is_dir(), reason=f"JSON Schema Test Suite not at {SUITE}")
@pytest.mark.parametrize("name", OLD_DRAFTS)
def test_suite_same_verdicts(name):
    dialect = by_name(name)
    declared = _reference(dialect)
    compared = 0
    refused: list[str] = []
    wrong = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for gid, group in _suite_groups(name):
            schema = group["schema"]
            if "localhost:1234" in json.dumps(schema) or (name, gid) in _DATA_MODEL:
                continue  # remote references: refused by the runtime
            if isinstance(schema, dict) and "$schema" not in schema:
                schema = {"$schema": dialect.uri, **schema}
            try:
                out = normalise(schema, dialect)
            except GrammarSpecError:
                refused.append(gid)
                continue
            for test in group["tests"]:
                want = _verdict(declared, schema, test["data"])
                got = _verdict(jsonschema.Draft202012Validator, out, test["data"])
                compared += 1
                # Where jsonschema's reading of the draft is off the suite's, the suite's
                # label is the reference.
                if got != want and not (want != test["valid"] and got == test["valid"]):
                    wrong.append((gid, test["description"], want, got))
    assert not wrong
    assert compared > 600
    assert refused == REFUSED.get(name, [])


#: Suite groups the rewrite refuses (fails closed on): draft 7's optional content assertions.
REFUSED = {"draft7": ["content.json#0", "content.json#1", "content.json#2"]}


# -- against jsonschema, on random small schemas ----------------------------------------------
hypothesis = pytest.importorskip("hypothesis")
st = pytest.importorskip("hypothesis.strategies")

_VALUES = st.one_of(st.integers(-2, 6), st.sampled_from(["a", "bb"]), st.none(), st.booleans())
# No integral floats: draft 4's data model tells 1.0 from 1 (see _DATA_MODEL).
_INSTANCES = st.recursive(_VALUES, lambda inner: st.one_of(
    st.lists(inner, max_size=3), st.dictionaries(st.sampled_from("abc"), inner, max_size=3)),
    max_leaves=6)
_LEAVES = st.one_of(
    st.builds(lambda t: {"type": t}, st.sampled_from(["integer", "string", "array", "object"])),
    st.builds(lambda n: {"minimum": n}, st.integers(-1, 4)),
    st.builds(lambda n, e: {"maximum": n, "exclusiveMaximum": e}, st.integers(0, 4),
              st.one_of(st.booleans(), st.integers(0, 4))),
    st.builds(lambda e: {"exclusiveMinimum": e}, st.one_of(st.booleans(), st.integers(0, 4))),
    st.builds(lambda v: {"const": v}, _VALUES),
    st.builds(lambda n: {"minItems": n}, st.integers(0, 2)),
    st.builds(lambda n: {"minContains": n, "maxContains": n + 1}, st.integers(0, 2)),
    st.just({"dependencies": {"a": ["b"]}, "dependentRequired": {"b": ["c"]}}),
    st.just({"$ref": "#/definitions/d", "type": "string"}),
)


def _extend(inner):
    return st.one_of(
        st.builds(lambda a: {"items": a}, inner),
        st.builds(lambda a, b, c: {"items": [a, b], "additionalItems": c}, inner, inner, inner),
        st.builds(lambda a, b: {"prefixItems": [a], "unevaluatedItems": b}, inner, inner),
        st.builds(lambda a: {"contains": a}, inner),
        st.builds(lambda a: {"dependencies": {"a": a}}, inner),
        st.builds(lambda a: {"properties": {"a": a}, "propertyNames": {"maxLength": 1}}, inner),
        st.builds(lambda a, b: {"if": a, "then": b}, inner, inner),
        st.builds(lambda a, b: {"allOf": [a, b]}, inner, inner),
        st.builds(lambda a, b: {**a, **b}, inner, inner),
    )


_SCHEMAS = st.recursive(_LEAVES, _extend, max_leaves=5)


@pytest.mark.parametrize("name", OLD_DRAFTS)
@hypothesis.settings(max_examples=150, deadline=None, derandomize=True,
                     suppress_health_check=list(hypothesis.HealthCheck))
@hypothesis.given(body=_SCHEMAS, instances=st.lists(st.one_of(st.integers(-2, 6), _INSTANCES),
                                                     min_size=2, max_size=6))
def test_random_schemas_same_verdicts(name, body, instances):
    dialect = by_name(name)
    declared = _reference(dialect)
    schema = {"$schema": dialect.uri, **body, "definitions": {"d": {"minLength": 2}}}
    hypothesis.assume(declared(declared.META_SCHEMA).is_valid(schema))
    try:
        out = normalise(schema, dialect)
    except GrammarSpecError:
        return  # refused: nothing accepted
    for data in instances:
        assert _verdict(jsonschema.Draft202012Validator, out, data) == \
            _verdict(declared, schema, data), (schema, out, data)


# -- through the runtime, on every engine -----------------------------------------------------
BUGS = [  # (schema, valid texts, invalid texts)
    ({"$schema": D7, "contains": {"minimum": 5}}, ["[5, 2]"], ["[2, 3, 4]", "[]"]),
    ({"$schema": D19, "contains": {"minimum": 5}, "minContains": 2},
     ["[5, 6]"], ["[2, 3, 5]", "[1]"]),
    ({"$schema": D19, "items": [{"type": "string"}], "unevaluatedItems": False},
     ['["foo"]', "[]"], ['["foo", "bar"]', "[1]"]),
    ({"$schema": D7, "$id": "http://x/root.json", "definitions": {"a": {"type": "integer"}},
      "properties": {"p": {"$id": "http://y/other.json", "$ref": "#/definitions/a",
                           "definitions": {"a": {"type": "string"}}}}},
     ['{"p": 1}'], ['{"p": "s"}']),
    ({"$schema": D4, "maximum": 5, "exclusiveMaximum": True}, ["4"], ["5", "6"]),
    # Draft 4's integers are written without a fraction (no 2020-12 form: docs/json_schema.md).
    ({"$schema": D4, "type": "integer"}, ["1"], ["1.0", "1e0"]),
    ({"$schema": D6, "items": [{"type": "integer"}], "additionalItems": {"type": "string"}},
     ['[1, "a"]'], ['[1, 2]', '["a"]']),
]


@pytest.mark.parametrize("engine", ["xgrammar", "llguidance", "auto"])
@pytest.mark.parametrize("case", range(len(BUGS)))
def test_declared_draft_enforced(engine, case, runtimes):
    schema, valid, invalid = BUGS[case]
    for text in invalid:
        assert decide_text(runtimes[engine], schema, text) is not True, text
    if engine == "auto":
        for text in valid:
            assert decide_text(runtimes[engine], schema, text) is True, text


METAMORPHIC = [  # schemas whose keywords mean the same in draft 7 and 2020-12
    {"type": "object", "properties": {"a": {"type": "integer", "minimum": 2},
                                      "b": {"enum": ["x", "y"]}},
     "required": ["a"], "additionalProperties": False},
    {"type": "array", "items": {"type": "string", "maxLength": 2}, "minItems": 1},
    {"anyOf": [{"type": "null"}, {"type": "string", "pattern": "^a"}]},
]
TEXTS = ['{"a": 2}', '{"a": 1}', '{"a": 3, "b": "x"}', '{"a": 3, "c": 1}', '["ab"]',
         '["abc"]', "[]", "null", '"ab"', '"b"']


@pytest.mark.parametrize("case", range(len(METAMORPHIC)))
def test_same_reading_same_language(case, runtimes):
    schema = METAMORPHIC[case]
    declared = {"$schema": D7, **schema}
    # The same 2020-12 text, so the same key, cache entry and grammar ...
    assert GrammarSpec.json_schema(declared).key == GrammarSpec.json_schema(schema).key
    # ... and, end to end, the same accepted texts.
    rt = runtimes["auto"]
    for text in TEXTS:
        assert decide_text(rt, declared, text) == decide_text(rt, schema, text), text


# -- the spec: cheap for 2020-12, checked under the declared draft ---------------------------
def test_2020_12_schema_not_walked(monkeypatch):
    import portable_guided.json_schema.normalise as module

    def walked(*args):
        raise AssertionError("normalise called")

    monkeypatch.setattr(module, "normalise", walked)
    schema = {"$schema": LATEST.uri, "type": "object", "properties": {"a": {}}}
    assert GrammarSpec.json_schema(schema).payload == schema
    assert GrammarSpec.json_schema({"type": "string"}).engine_schema_text() == \
        '{"type":"string"}'


def test_nested_dialect_refused_in_2020_12():
    with pytest.raises(GrammarSpecError, match="inside"):
        GrammarSpec.json_schema({"$defs": {"a": {"$id": "http://x/a", "$schema": D7,
                                                 "items": {"$ref": "#/$defs/b"}},
                                           "b": {}}})
    with pytest.raises(GrammarSpecError, match="no supported"):
        GrammarSpec.json_schema({"items": {"$schema": "http://json-schema.org/draft-03/schema#"}})
    # Names and data are not schemas: a property called $schema is fine.
    GrammarSpec.json_schema({"properties": {"$schema": {"const": {"$schema": D4}}}})
    GrammarSpec.json_schema({"items": {"$schema": LATEST.uri}})
    assert GrammarSpec.json_schema(True).payload is True


PLAIN = {"type": "object", "properties": {"n": {"type": "integer", "maximum": 3},
                                          "s": {"enum": ["a", "b"]}},
         "required": ["n"], "additionalProperties": False, "description": "copied"}


@pytest.mark.parametrize("outer", [None, D7])
def test_nested_dialect_that_reads_alike_is_accepted(outer):
    # GitHub schemas embed definitions copied from draft-4 files: where every keyword means
    # the same in both drafts, the nested $schema changes nothing and the schema compiles.
    root = {"$ref": "#/definitions/a",
            "definitions": {"a": {"$schema": D4, "id": "http://x/a.json", **PLAIN}}}
    if outer:
        root = {"$schema": outer, **root}
    spec = GrammarSpec.json_schema(root)
    engine_form = json.loads(spec.engine_schema_text())
    assert "definitions" in engine_form or "$defs" in engine_form


@pytest.mark.parametrize("inner", [
    {"maximum": 3, "exclusiveMaximum": True},  # a boolean bound in draft 4
    {"items": [{"type": "string"}]},  # positional in draft 4
    {"id": "http://x/a", "properties": {"p": {"$ref": "#/definitions/b"}}},  # a base URI
    {"$ref": "#/definitions/b", "type": "string"},  # siblings ignored in draft 4
    {"properties": {"x": {"dependencies": {"a": ["b"]}}}},  # deeper: 2020-12 drops it
])
def test_nested_dialect_that_reads_otherwise_is_refused(inner):
    root = {"$ref": "#/definitions/a",
            "definitions": {"a": {"$schema": D4, **inner}, "b": {"type": "string"}}}
    with pytest.raises(GrammarSpecError, match="inside"):
        GrammarSpec.json_schema(root)


def test_checked_under_the_declared_draft():
    with pytest.raises(GrammarSpecError, match="invalid JSON schema"):
        GrammarSpec.json_schema({"$schema": D4, "exclusiveMaximum": 3})  # boolean in draft 4
    with pytest.raises(GrammarSpecError, match="invalid JSON schema"):
        GrammarSpec.json_schema({"$schema": D4, "properties": {"a": True}})
    spec = GrammarSpec.json_schema({"$schema": D4, "maximum": 3, "exclusiveMaximum": True})
    assert spec.payload == {"exclusiveMaximum": 3} and not spec.deferred_check


def _large(schema_extra):
    props = {f"p{i}": {"type": "string", "title": f"t{i}"} for i in range(80)}
    return {"$schema": D4, "type": "object", "properties": props, **schema_extra}


def test_deferred_check_uses_the_declared_draft():
    # Large and not proven by the quick proof (a draft-4 enum of numbers: its uniqueness is
    # proven for strings only), so the check is left to the compile job.
    unproven = _large({"maximum": 3, "exclusiveMaximum": True})
    unproven["properties"]["p1"] = {"enum": [1, 2]}
    spec = GrammarSpec.json_schema(unproven)
    assert spec.deferred_check and spec.payload["$schema"] == D4
    spec.run_deferred_check()
    engine_form = json.loads(spec.engine_schema_text())
    assert "$schema" not in engine_form and engine_form["exclusiveMaximum"] == 3
    large = _large({})
    large["properties"]["p0"] = True  # no boolean schemas in draft 4
    large["properties"]["p1"] = {"enum": [1, 2]}
    bad = GrammarSpec.json_schema(large)
    assert bad.deferred_check
    with pytest.raises(GrammarSpecError, match="invalid JSON schema"):
        bad.run_deferred_check()
    # Sent to a compile worker and back: still the declared form, still to be checked.
    again = GrammarSpec.from_dict(bad.to_dict())
    with pytest.raises(GrammarSpecError):
        again.run_deferred_check()


def test_unchecked_spec_still_reads_the_declared_draft():
    spec = GrammarSpec.json_schema({"$schema": D7, "contains": {"minimum": 5}},
                                   validate=False, strict=True)
    assert json.loads(spec.engine_schema_text()) == {"contains": {"minimum": 5}}


def test_structural_tag_schema_normalised():
    spec = GrammarSpec.structural_tag(
        [{"begin": "<f>", "schema": {"$schema": D4, "maximum": 1, "exclusiveMaximum": True},
          "end": "</f>"}], ["<f>"])
    assert spec.payload["tags"][0]["schema"] == {"exclusiveMaximum": 1}


def test_front_end_imports_no_engine():
    import subprocess
    import sys

    code = ("import sys, portable_guided.json_schema.normalise; "
            "print([m for m in ('xgrammar', 'llguidance', 'torch', 'jsonschema') "
            "if m in sys.modules])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True)
    assert out.stdout.strip() == "[]"


def test_the_docs_hold_the_generated_keyword_table():
    """docs/json_schema_keywords.md's per-draft keyword table is the one generated from the table."""
    from pathlib import Path

    from portable_guided.json_schema.dialects import keyword_table_markdown

    docs = (Path(__file__).resolve().parents[2] / "docs" / "json_schema_keywords.md").read_text()
    flat = "\n".join(line.strip() for line in docs.splitlines())
    assert keyword_table_markdown().strip() in flat
