"""The lowering is exact: for a schema S and its lowered form S' (runtime/json_lowering.py),
the ``jsonschema`` validator (the independent oracle) decides every instance the same way.
With ``approximate=True`` (what the engines compile) it is sound: S' accepts no instance S
rejects.

Checked on the JSON Schema Test Suite's schemas and instances, and by hypothesis on random
schemas built from the keywords the lowering rewrites, against random instances drawn from a
small vocabulary (so that properties, bounds and constants collide often).
"""

from __future__ import annotations

import itertools
import json

import pytest
from runtime_helpers import suite_dir

from portable_guided.harness.generation import validator_for
from portable_guided.runtime.json_lowering import disjoint, lower, unsound

jsonschema = pytest.importorskip("jsonschema")
hypothesis = pytest.importorskip("hypothesis")
st = pytest.importorskip("hypothesis.strategies")
from hypothesis import HealthCheck, given, settings

SUITE = suite_dir()


def _valid(schema, instance) -> bool:
    # Formats are assertions, as the runtime enforces them (docs/json_schema.md); patterns
    # Python's re cannot read (\p{...}) are read by the regex module.
    return validator_for(schema).is_valid(instance)  # (2020-12 unless $schema says)


def _unchecked_formats(schema) -> set[str]:
    import re

    known = jsonschema.Draft202012Validator.FORMAT_CHECKER.checkers
    return set(re.findall(r'"format": "([^"]+)"', json.dumps(schema))) - set(known)


def _suite_groups():
    if not SUITE.is_dir():
        return []
    out = []
    for path in sorted(SUITE.glob("*.json")):
        for i, group in enumerate(json.loads(path.read_text(encoding="utf-8"))):
            text = json.dumps(group["schema"])
            # Remote references would be fetched by the validator: not local, not lowered.
            if "localhost:1234" in text or path.name in ("refRemote.json", "vocabulary.json"):
                continue
            group = {**group, "formats": path.name == "format.json"}
            out.append(pytest.param(group, id=f"{path.stem}-{i}"))
    return out


@pytest.mark.skipif(not SUITE.is_dir(), reason=f"JSON Schema Test Suite not at {SUITE}")
@pytest.mark.parametrize("group", _suite_groups())
def test_lowering_keeps_the_suite_decisions(group):
    lowered = lower(group["schema"])
    for test in group["tests"]:
        # format.json labels formats as annotations; here they are assertions.
        expected = _valid(group["schema"], test["data"]) if group.get("formats") else test[
            "valid"]
        assert _valid(lowered, test["data"]) == expected, (test, lowered)
    narrowed = lower(group["schema"], approximate=True)
    if _unchecked_formats(narrowed):
        return  # the validator cannot check the format the subset uses
    for test in group["tests"]:
        if not _valid(group["schema"], test["data"]) or not test["valid"]:
            assert not _valid(narrowed, test["data"]), (test, narrowed)


# -- random schemas and instances ------------------------------------------------------------
NAMES = ["a", "b", "c"]
SCALARS = [None, True, False, 0, 1, 2, -1, 1.5, "", "a", "ab", "abc", "2024-02-29",
           "2023-02-29"]

instances = st.recursive(
    st.sampled_from(SCALARS),
    lambda inner: st.one_of(st.lists(inner, max_size=3),
                            st.dictionaries(st.sampled_from([*NAMES, "d"]), inner, max_size=3)),
    max_leaves=6,
)

TYPES = ["null", "boolean", "object", "array", "string", "number", "integer"]


def _leaf_keywords():
    return st.one_of(
        st.builds(lambda t: {"type": t}, st.sampled_from(TYPES)),
        st.builds(lambda t: {"type": t}, st.lists(st.sampled_from(TYPES), min_size=1,
                                                  max_size=3, unique=True)),
        st.builds(lambda k, v: {k: v}, st.sampled_from(
            ["minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"]),
            st.sampled_from([0, 1, 1.5])),
        st.builds(lambda k, v: {k: v}, st.sampled_from(
            ["minLength", "maxLength", "minItems", "maxItems", "minProperties",
             "maxProperties"]), st.integers(0, 2)),
        st.builds(lambda r: {"required": r}, st.lists(st.sampled_from(NAMES), min_size=1,
                                                      max_size=2, unique=True)),
        st.builds(lambda v: {"const": v}, st.sampled_from(SCALARS)),
        st.builds(lambda v: {"enum": v}, st.lists(st.sampled_from(SCALARS), min_size=1,
                                                  max_size=3)),
        st.builds(lambda d: {"dependentRequired": d}, st.dictionaries(
            st.sampled_from(NAMES), st.lists(st.sampled_from(NAMES), max_size=2, unique=True),
            min_size=1, max_size=2)),
        st.just({"uniqueItems": True}),
        st.builds(lambda m: {"multipleOf": m}, st.sampled_from([2, 3])),
    )


def _schemas(refs=("x",)):
    def extend(inner):
        sub = st.one_of(inner, st.booleans())
        return st.one_of(
            st.builds(lambda p, ap: {"properties": p, **ap},
                      st.dictionaries(st.sampled_from(NAMES), sub, min_size=1, max_size=2),
                      st.one_of(st.just({}), st.builds(lambda s: {"additionalProperties": s},
                                                       sub))),
            st.builds(lambda p, u: {"properties": p, "unevaluatedProperties": u},
                      st.dictionaries(st.sampled_from(NAMES), sub, max_size=2), sub),
            st.builds(lambda i: {"items": i}, sub),
            st.builds(lambda p, i: {"prefixItems": p, **i}, st.lists(sub, min_size=1,
                                                                     max_size=2),
                      st.one_of(st.just({}), st.builds(lambda s: {"items": s}, sub),
                                st.builds(lambda s: {"unevaluatedItems": s}, sub))),
            st.builds(lambda k, bs: {k: bs}, st.sampled_from(["allOf", "anyOf", "oneOf"]),
                      st.lists(sub, min_size=1, max_size=3)),
            st.builds(lambda s: {"not": s}, sub),
            st.builds(lambda i, t, e: {"if": i, **t, **e}, sub,
                      st.one_of(st.just({}), st.builds(lambda s: {"then": s}, sub)),
                      st.one_of(st.just({}), st.builds(lambda s: {"else": s}, sub))),
            st.builds(lambda d: {"dependentSchemas": d},
                      st.dictionaries(st.sampled_from(NAMES), sub, min_size=1, max_size=2)),
            st.builds(lambda a, b: {**a, **b}, inner, inner),
        )
    # "#/$defs/x" leaves; the test puts a random schema at /$defs/x of the root.
    leaves = st.one_of(_leaf_keywords(),
                       st.sampled_from([{"$ref": f"#/$defs/{name}"} for name in refs])
                       ) if refs else _leaf_keywords()
    return st.recursive(leaves, extend, max_leaves=6)


def _rooted(schema, target):
    if not isinstance(schema, dict):
        return schema
    return {**schema, "$defs": {"x": target}}


def _checked(schema, target, xs):
    """The rooted schema and the validator's decisions on ``xs``; decisions None for a
    schema the meta-schema rejects or the validator cannot decide."""
    schema = _rooted(schema, target)
    return schema, _decided(schema, xs)


def _decided(schema, xs):
    """The validator's decisions on ``xs``; None for a schema the meta-schema rejects or
    the validator cannot decide."""
    try:
        jsonschema.Draft202012Validator.check_schema(schema)
    except jsonschema.SchemaError:
        return None
    return _decisions(schema, xs)


@settings(max_examples=1500, deadline=None, suppress_health_check=list(HealthCheck))
@given(_schemas(), _schemas(), st.lists(instances, min_size=8, max_size=8))
def test_lowering_is_exact_on_random_schemas(schema, target, xs):
    schema, expected = _checked(schema, target, xs)
    if expected is None:
        return
    lowered = lower(schema)
    got = _decisions(lowered, xs)
    assert got in (expected, None), (schema, lowered, xs)
    _assert_subset(schema, expected, xs)


@settings(max_examples=500, deadline=None, suppress_health_check=list(HealthCheck))
@given(_schemas(("x", "y")), _schemas(("y",)), _schemas(()),
       st.lists(instances, min_size=8, max_size=8))
def test_lowering_is_exact_with_a_chain_of_definitions(schema, x, y, xs):
    """A definition whose leaves may refer to a second one (which refers to none): targets
    with references inside, merged where they meet other keywords. (Cycles: the single
    definition above, and the recursive targets below.)"""
    # (an allOf beside the definition's reference: the lowering merges its target there)
    schema = {"allOf": [schema, {"$ref": "#/$defs/x"}], "$defs": {"x": x, "y": y}}
    expected = _decided(schema, xs)
    if expected is None:
        return
    got = _decisions(lower(schema), xs)
    assert got in (expected, None), (schema, lower(schema), xs)
    _assert_subset(schema, expected, xs)


def _assert_subset(schema, expected, xs):
    """The approximate lowering accepts no instance ``schema`` rejects."""
    narrowed = lower(schema, approximate=True)
    got = _decisions(narrowed, xs)
    if got is not None:
        wrong = [x for x, e, g in zip(xs, expected, got) if g and not e]
        assert not wrong, (schema, narrowed, wrong)


@settings(max_examples=800, deadline=None, suppress_health_check=list(HealthCheck))
@given(_schemas(), _schemas(), st.lists(instances, min_size=6, max_size=6))
def test_one_of_kept_only_where_branches_are_disjoint(schema, target, xs):
    """Where :func:`unsound` passes a lowered ``oneOf``, reading it as ``anyOf`` (what the
    engines do) decides every instance as JSON Schema does."""
    schema, expected = _checked(schema, target, xs)
    if expected is None:
        return
    lowered = lower(schema)
    if unsound(lowered):
        return
    as_any = json.loads(json.dumps(lowered).replace('"oneOf"', '"anyOf"'))
    # As where the templates check it: the validator may not decide a $ref cycle.
    assert _decisions(as_any, xs) in (expected, None), (schema, lowered, xs)


_VALUE_BRANCHES = st.lists(st.one_of(
    st.builds(lambda v: {"enum": v}, st.lists(st.sampled_from([*SCALARS, 1.0]), min_size=1,
                                              max_size=4)),
    st.builds(lambda v: {"const": v}, st.sampled_from([*SCALARS, 2.0])),
    st.builds(lambda v, t: {"enum": v, "type": t, "title": "x"},
              st.lists(st.sampled_from(SCALARS), min_size=1, max_size=4),
              st.sampled_from(TYPES)),
    st.just(False)), min_size=1, max_size=4)


@settings(max_examples=400, deadline=None, suppress_health_check=list(HealthCheck))
@given(_VALUE_BRANCHES, st.sampled_from([{}, {"type": "integer"}, {"type": ["string", "null"]}]))
def test_one_of_of_values_keeps_the_values_exactly_one_branch_accepts(branches, beside):
    schema = {**beside, "oneOf": branches}
    lowered = lower(schema)
    assert "oneOf" not in json.dumps(lowered), lowered  # (never left for the engines)
    for x in [*SCALARS, 1.0, 2.0, -1.0, [0], {"a": 1}]:
        assert _valid(lowered, x) == _valid(schema, x), (schema, lowered, x)


def _decisions(schema, xs):
    """The validator's decisions, None where it cannot decide (a $ref cycle that consumes
    no input recurses forever; whether the validator meets it depends on the order in which
    it checks keywords)."""
    try:
        return [_valid(schema, x) for x in xs]
    except RecursionError:
        return None
    except BaseException as exc:  # the validator's Rust registry panics past some depth
        if type(exc).__name__ != "PanicException":
            raise
        return None


# -- templates: each rewrite on flat operands (random nesting reaches them rarely) -----------
CONCRETE = [
    {"type": "integer"}, {"type": "number"}, {"type": "string"}, {"type": "object"},
    {"type": "array"}, {"type": ["string", "null"]}, {"minimum": 0}, {"minimum": 1},
    {"maximum": 1}, {"exclusiveMinimum": 0}, {"exclusiveMaximum": 1.5}, {"minLength": 1},
    {"maxLength": 1}, {"minItems": 1}, {"maxItems": 1}, {"minProperties": 1},
    {"maxProperties": 1}, {"required": ["a"]}, {"required": ["b"]}, {"const": 1},
    {"const": "a"}, {"enum": [None, True]}, {"enum": ["a", 1]}, {"multipleOf": 2},
    {"dependentRequired": {"a": ["b"]}}, {"maxItems": 2.0}, {"minLength": 1.0},
    {"type": "integer"}, {"enum": ["ab", "a", 1.5]}, {"const": [0]}, {"const": {"a": 1}},
    {"format": "date"}, {"type": ["string", "null"], "format": "date"},
]


def _flat(r):
    """One to three keywords together (from a small pool, so that they collide), or a
    properties / prefixItems map of them."""
    def leaf():
        out = {}
        for _ in range(r.randint(1, 3)):
            out.update(r.choice(CONCRETE))
        return out

    def sub():
        return r.choice([True, False, leaf(), leaf(), leaf()])

    kind = r.randrange(5)
    if kind == 0:
        out = {"properties": {n: sub() for n in r.sample(NAMES, r.randint(1, 2))}}
        if r.random() < 0.4:
            out["additionalProperties"] = sub()
        return out
    if kind == 1:
        out = {"prefixItems": [sub() for _ in range(r.randint(1, 2))]}
        if r.random() < 0.4:
            out["items"] = sub()
        return out
    if kind == 2:
        return {**leaf(), "properties": {r.choice(NAMES): sub()}}
    return leaf()


def _template(r):
    """A schema exercising one rewrite on flat operands."""
    f = lambda: _flat(r)
    kind = r.randrange(16)
    if kind == 13:  # contains, its counts and the vacuous forms
        counts = r.choice([{}, {"minContains": 0}, {"minContains": 1.0}, {"maxContains": 1},
                           {"minContains": 2, "maxContains": 2}, {"maxContains": 0}])
        out = {**f(), "contains": r.choice([True, False, {}, f(), f()]), **counts,
               **r.choice([{}, {"items": r.choice(CONCRETE)}])}
        if r.random() < 0.3:
            out["unevaluatedItems"] = r.choice([False, f()])
        return out
    if kind == 14:  # overlapping oneOf, not of forms without an exact complement
        return {**r.choice([{}, f()]), r.choice(["oneOf", "not"]): r.choice(
            [[f() for _ in range(r.randint(2, 3))], f()])} if r.random() < 0.5 else {
            "oneOf": [f() for _ in range(r.randint(2, 4))]}
    if kind == 15:
        if r.random() < 0.5:  # a narrowed subschema under a negation must not widen it
            inner = r.choice([{"not": f()}, {"oneOf": [f(), f()]}, {"contains": f()},
                              {"type": "string", "format": "idn-email"}])
            return r.choice([{"not": inner}, {"oneOf": [inner, f()]}, {"if": inner, "then": f()},
                             {"contains": inner, "maxContains": 1},
                             {"$defs": {"x": inner}, "not": {"$ref": "#/$defs/x"}},
                             {"$defs": {"x": {"anyOf": [inner, {"items": {"$ref": "#/$defs/x"}}]}},
                              "oneOf": [{"$ref": "#/$defs/x"}, f()]}])
        return {**f(), r.choice(["propertyNames", "items", "additionalProperties"]):
                r.choice([True, False, {}])}
    if kind == 12:  # oneOf with a discriminator property (or not quite one)
        return {"oneOf": [{**r.choice([{}, r.choice(CONCRETE)]),
                           "properties": {"a": r.choice([{"const": v}, {"enum": [v, "x"]}])},
                           **r.choice([{"required": ["a"]}, {}])}
                          for v in r.sample(["p", "q", 1, None], r.randint(2, 3))]}
    if kind == 0:
        return {**f(), "allOf": [f() for _ in range(r.randint(1, 3))]}
    if kind == 1:
        return {**f(), "not": f()}
    if kind == 2:
        return {**f(), "if": f(), "then": f(), "else": f()}
    if kind == 3:
        return {"if": f(), **r.choice([{"then": f()}, {"else": f()}])}
    if kind in (4, 5):
        return {**f(), r.choice(["anyOf", "oneOf"]): [f() for _ in range(r.randint(1, 3))]}
    if kind == 6:
        return {**f(), "dependentSchemas": {r.choice(NAMES): f()}}
    if kind == 7:
        child = r.choice([{**f(), "not": f()}, {"if": f(), "then": f()}, {"if": f()}])
        return {**f(), r.choice(["not", "if", "then", "allOf"]): child,
                "unevaluatedProperties": r.choice([True, False, f()])}
    if kind == 8:
        return {**f(), "allOf": [f(), f()], "unevaluatedProperties": r.choice([False, f()])}
    if kind == 9:
        return {**f(), "allOf": [f()], "unevaluatedItems": r.choice([False, f()])}
    if kind == 10:
        return {"$defs": {"x": f()}, "$ref": "#/$defs/x", **f()}
    return {"allOf": [{"anyOf": [f(), f()]}, {r.choice(["anyOf", "oneOf"]): [f(), f()]}]}


def _instance(r, depth=0):
    kind = r.randrange(6 if depth < 2 else 4)
    if kind < 4:
        return r.choice(SCALARS)
    if kind == 4:
        return [_instance(r, depth + 1) for _ in range(r.randint(0, 3))]
    return {n: _instance(r, depth + 1) for n in r.sample([*NAMES, "d"], r.randint(0, 3))}


@pytest.mark.parametrize("chunk", range(4))
def test_each_rewrite_is_exact(chunk):
    """4,000 random templates (seeded: a failure names its seed), 12 instances each."""
    import random

    for seed in range(chunk * 1000, (chunk + 1) * 1000):
        r = random.Random(seed)
        schema, xs = _template(r), [_instance(r) for _ in range(12)]
        expected = _decided(schema, xs)
        if expected is None:
            continue
        lowered = lower(schema)
        got = _decisions(lowered, xs)
        assert got in (expected, None), (seed, schema, lowered, xs)
        _assert_subset(schema, expected, xs)
        if not unsound(lowered):
            as_any = json.loads(json.dumps(lowered).replace('"oneOf"', '"anyOf"'))
            assert _decisions(as_any, xs) in (expected, None), (seed, schema, lowered, xs)


# -- the disjointness proof behind every oneOf kept ------------------------------------------
_ABSENT = object()  # a property left out of a candidate object
VALUES = [None, 0, 1, "a", "b", True]
CANDIDATES = [*SCALARS, [], [0], {}] + [
    {name: value for name, value in zip(NAMES, combo) if value is not _ABSENT}
    for combo in itertools.product([_ABSENT, *VALUES], repeat=len(NAMES))]


def _branch():
    prop = st.one_of(st.booleans(), st.builds(lambda v: {"const": v}, st.sampled_from(VALUES)),
                     st.builds(lambda v: {"enum": v}, st.lists(st.sampled_from(VALUES),
                                                               min_size=1, max_size=2)),
                     st.builds(lambda t: {"type": t}, st.sampled_from(TYPES)),
                     # literal patterns (one string each) and patterns that are not
                     st.builds(lambda p: {"type": "string", "pattern": p}, st.sampled_from(
                         ["^a$", "^b$", "^a", "b$", "^.$", "^a|b$", "^(a)$"])))
    return st.builds(
        lambda props, req, closed, typed: {
            **({"type": "object"} if typed else {}), "properties": props,
            **({"required": req} if req else {}),
            **({"additionalProperties": False} if closed else {})},
        st.dictionaries(st.sampled_from(NAMES), prop, max_size=3),
        st.lists(st.sampled_from(NAMES), max_size=2, unique=True), st.booleans(),
        st.booleans()) | _leaf_keywords() | st.builds(
            # negations: of one type's keywords (`not {"items": ...}` takes arrays only)
            lambda n: {"not": n}, _leaf_keywords() | st.builds(
                lambda k, v: {k: v}, st.sampled_from(["items", "contains"]),
                st.sampled_from([{"type": "string"}, {"const": 0}, True, False])))


def _branch_or_union():
    # anyOf/oneOf of branches, beside keywords of their own: disjoint() distributes them.
    return _branch() | st.builds(lambda k, xs, rest: {**rest, k: xs},
                                 st.sampled_from(["anyOf", "oneOf"]),
                                 st.lists(_branch(), min_size=1, max_size=3), _branch())


@settings(max_examples=3000, deadline=None, suppress_health_check=list(HealthCheck))
@given(_branch_or_union(), _branch_or_union())
def test_disjoint_is_never_wrong(a, b):
    """Every pair :func:`disjoint` calls disjoint is: no candidate instance (every object over
    the property names and values used, and scalars) validates against both. This proof is
    what lets a ``oneOf`` be read as ``anyOf`` soundly."""
    if not disjoint(a, b, {}):
        return
    both = [x for x in CANDIDATES if _valid(a, x) and _valid(b, x)]
    assert not both, (a, b, both[:3])


def test_a_narrowed_definition_under_a_negation_keeps_its_exact_form():
    # x is recursive (its $ref stays) and narrowed ("not integer" has no exact form: the
    # subset leaves 1.5 out). Under `not` (kept: unevaluatedItems beside it, which
    # `contains` keeps from becoming `items`), the narrowed x would let 1.5 through.
    schema = {"$defs": {"x": {"anyOf": [{"not": {"type": "integer"}},
                                        {"type": "array", "items": {"$ref": "#/$defs/x"}}]}},
              "not": {"$ref": "#/$defs/x"}, "type": ["number", "array"],
              "contains": {"type": "number"}, "unevaluatedItems": False}
    narrowed = lower(schema, approximate=True)
    assert narrowed["$defs"]["pg0"] != narrowed["$defs"]["pg0_exact"]
    for x in (1.5, 1, [1.5], [1], "a", [[1]]):
        assert not _valid(narrowed, x) or _valid(schema, x), (x, narrowed)
    assert _valid(narrowed, 1) and not _valid(narrowed, 1.5)


def _full_lowering(schema):
    import copy

    from portable_guided.runtime import json_lowering as jl

    return jl._Lowerer(jl._hoist_refs(copy.deepcopy(schema)), approximate=True).run()


def _hoisted(schema):
    """``schema`` with its references renamed as the lowering names them (``#/$defs/pg<n>``)
    and nothing else changed: the form a plain reference to a root definition takes."""
    import copy

    from portable_guided.runtime import json_lowering as jl

    return jl._hoist_refs(copy.deepcopy(schema))


@settings(max_examples=1000, deadline=None, suppress_health_check=list(HealthCheck))
@given(_schemas(), _schemas())
def test_schemas_the_fast_path_skips_lower_to_themselves(schema, target):
    """``lower`` returns a schema untouched when ``needs_lowering`` says no rewrite can
    change it; every rewrite agrees (the full lowering only renames plain references)."""
    from portable_guided.json_schema.lowering import needs_lowering

    schema = _rooted(schema, target) if isinstance(schema, dict) and "$ref" in json.dumps(
        schema) else schema
    if not isinstance(schema, dict) or needs_lowering(schema):
        return
    assert json.dumps(_full_lowering(schema)) == json.dumps(_hoisted(schema))


def _lowered_with_hint(schema, everything: bool):
    """The lowering of ``schema`` with the keyword hint read from its text, or with one that
    says every keyword may be anywhere (every walk taken in full)."""
    import copy

    from portable_guided.runtime import json_lowering as jl

    class Everything(jl._KeyHint):
        def count(self, key: str) -> int:
            return 1 << 20

    hint = Everything("") if everything else jl._KeyHint.of(schema)
    return json.dumps(jl._lower_owned(copy.deepcopy(schema), approximate=True, keys=hint))


@settings(max_examples=500, deadline=None, suppress_health_check=list(HealthCheck))
@given(_schemas(), _schemas())
def test_walks_the_keyword_hint_skips_change_nothing(schema, target):
    # The hint (what keywords the text holds) skips the pointer walk, the cleanup walk and
    # the unevaluated* check; with every keyword possibly anywhere, each runs in full.
    if not isinstance(schema, dict):
        return
    schema = _rooted(schema, target) if "$ref" in json.dumps(schema) else schema
    nested = ({"$schema": "y"}, {"definitions": {"v": {}}}, {"$defs": {"v": {}}},
              {"$anchor": "p"}, {"$dynamicAnchor": "p"}, {"$id": "p.json"})
    for extra in ({}, {"$id": "https://x.test/s"}, {"$schema": "y"},
                  *({"properties": {"p": n}} for n in nested)):
        doc = {**schema, **extra}
        assert _lowered_with_hint(doc, everything=False) == _lowered_with_hint(
            doc, everything=True), doc


def test_keywords_spelled_with_escapes_are_keywords():
    from portable_guided.runtime.json_lowering import engine_schema_text

    plain = ('{"$defs": {"a": {"type": "integer"}}, "type": "object", '
             '"properties": {"x": {"$ref": "#/$defs/a", "minimum": 1}}}')
    escaped = plain.replace('"$defs"', '"\\u0024defs"').replace('"$ref"', '"\\u0024ref"')
    assert escaped != plain and json.loads(escaped) == json.loads(plain)
    lowered = engine_schema_text.__wrapped__(plain)
    assert '"minimum":1' in lowered and '"$ref"' not in lowered  # (the target merged in)
    assert engine_schema_text.__wrapped__(escaped) == lowered


@pytest.mark.skipif(not SUITE.is_dir(), reason=f"JSON Schema Test Suite not at {SUITE}")
def test_suite_and_maskbench_schemas_the_fast_path_skips_lower_to_themselves():
    from pathlib import Path

    from portable_guided.json_schema.lowering import needs_lowering

    schemas = [g["schema"] for path in sorted(SUITE.glob("*.json"))
               for g in json.loads(path.read_text(encoding="utf-8"))]
    maskbench = SUITE.parents[1] / "maskbench"
    for path in sorted(Path(maskbench).glob("*.jsonl"))[:6]:
        schemas += [json.loads(line)["schema"] for line in path.open(encoding="utf-8")][:300]
    skipped = [s for s in schemas if isinstance(s, dict) and not needs_lowering(s)]
    assert len(skipped) > 100
    for s in skipped:
        assert json.dumps(_full_lowering(s)) == json.dumps(_hoisted(s)), s


# -- unevaluated* beside oneOf / if / anyOf ----------------------------------------------------
OBJECT_INSTANCES = st.dictionaries(st.sampled_from([*NAMES, "d"]), instances, max_size=3)
ARRAY_INSTANCES = st.lists(instances, max_size=3)


def _annotating(sub):
    """Subschemas that evaluate properties or items (what unevaluated* sees through)."""
    return st.one_of(
        st.builds(lambda p, r: {"properties": p, **r},
                  st.dictionaries(st.sampled_from(NAMES), sub, min_size=1, max_size=2),
                  st.one_of(st.just({}), st.builds(lambda n: {"required": n}, st.lists(
                      st.sampled_from(NAMES), min_size=1, max_size=2, unique=True)))),
        st.builds(lambda p: {"prefixItems": p}, st.lists(sub, min_size=1, max_size=3)),
        st.builds(lambda u: {"unevaluatedProperties": u}, st.booleans()),
        sub,
    )


@st.composite
def _beside_unevaluated(draw):
    sub = _schemas()
    branch = _annotating(sub)
    key = draw(st.sampled_from(["oneOf", "anyOf", "if"]))
    shape = (
        {"if": draw(branch), **draw(st.one_of(st.just({}), st.builds(
            lambda t: {"then": t}, branch))), **draw(st.one_of(st.just({}), st.builds(
                lambda e: {"else": e}, branch)))}
        if key == "if" else {key: draw(st.lists(branch, min_size=1, max_size=3))})
    own = draw(st.one_of(st.just({}), _annotating(sub)))
    if not isinstance(own, dict):
        own = {}
    word = draw(st.sampled_from(["unevaluatedProperties", "unevaluatedItems"]))
    return {**own, **shape, word: draw(st.one_of(st.booleans(), sub))}


@settings(max_examples=600, deadline=None, suppress_health_check=list(HealthCheck))
@given(_beside_unevaluated(), _schemas(),
       st.lists(st.one_of(OBJECT_INSTANCES, ARRAY_INSTANCES, instances), min_size=8,
                max_size=8))
def test_unevaluated_beside_branches_is_exact(schema, target, xs):
    """Each way the instance can be valid becomes a branch of its own, whose unevaluated*
    sees what the original saw: the validator decides every instance the same way, and the
    approximate form (anyOf branches alone) accepts nothing the schema rejects."""
    schema, expected = _checked(schema, target, xs)
    if expected is None:
        return
    lowered = lower(schema)
    got = _decisions(lowered, xs)
    assert got in (expected, None), (schema, lowered, xs)
    _assert_subset(schema, expected, xs)


def test_unevaluated_beside_one_of_and_if_become_additional_keywords():
    """The suite's shapes the engines could not take before (unevaluatedProperties.json
    groups 12 and 14): with the branches split, no unevaluated* keyword is left."""
    one_of = {"properties": {"foo": {"type": "string"}},
              "oneOf": [{"properties": {"bar": {"const": "bar"}}, "required": ["bar"]},
                        {"properties": {"baz": {"const": "baz"}}, "required": ["baz"]}],
              "unevaluatedProperties": False}
    if_then = {"if": {"properties": {"foo": {"const": "then"}}, "required": ["foo"]},
               "then": {"properties": {"bar": {"type": "string"}}, "required": ["bar"]},
               "else": {"properties": {"baz": {"type": "string"}}, "required": ["baz"]},
               "unevaluatedProperties": False}
    for schema in (one_of, if_then):
        lowered = lower(schema, approximate=True)
        assert "unevaluated" not in json.dumps(lowered), lowered
    assert _valid(lower(one_of), {"foo": "x", "bar": "bar"})
    assert not _valid(lower(one_of), {"foo": "x", "bar": "bar", "baz": "baz"})
    assert not _valid(lower(one_of), {"bar": "bar", "other": 1})
    assert _valid(lower(if_then), {"foo": "then", "bar": "x"})
    assert not _valid(lower(if_then), {"foo": "then", "bar": "x", "baz": "y"})
    assert _valid(lower(if_then), {"foo": "else", "baz": "y"}) is False  # foo unevaluated
    assert _valid(lower(if_then), {"baz": "y"})


def test_a_dependency_evaluates_nothing_on_other_instances():
    # Found by test_unevaluated_beside_branches_is_exact: dependentSchemas applies its schema
    # to objects holding the name only; lowered as `required` merged with it, its `items`
    # evaluated an array's items too, so unevaluatedItems accepted [None].
    schema = {"anyOf": [{"properties": {"a": {"type": "null"}}},
                        {"dependentSchemas": {"a": {"items": {"type": "null"}}}}],
              "unevaluatedItems": False}
    for approximate in (False, True):
        lowered = lower(schema, approximate=approximate)
        for x in ([None], [], {"a": None}, {"a": 1}, {"b": [None]}, None, "s"):
            assert _valid(lowered, x) == _valid(schema, x), (approximate, x, lowered)


def test_enum_beside_keywords_with_refs_keeps_the_values_the_schema_accepts():
    """The enum filter resolves a ``$ref`` inside in the document's definitions (the
    MaskBench Synthesized ``ref ... not`` shapes); a definition with an ``$id`` that would
    move the base URI keeps it away."""
    schema = {"$defs": {"s": {"type": "string"}, "n": {"type": "integer"}},
              "enum": [{"a": "x"}, {"a": 1}, {"b": 2}, 3],
              "properties": {"a": {"$ref": "#/$defs/s"}, "b": {"$ref": "#/$defs/n"}}}
    lowered = lower(schema)
    assert lowered.get("enum") == [{"a": "x"}, {"b": 2}, 3], lowered
    assert set(lowered) - {"$defs"} == {"enum"}
    recursive = {"allOf": [{"enum": [{"foo": False}, {"foo": {"bar": 1}}]},
                           {"properties": {"foo": {"$ref": "#/allOf/1"}},
                            "additionalProperties": False}]}
    assert lower(recursive).get("enum") == [{"foo": False}]
    for x in ({"foo": False}, {"foo": {"bar": 1}}, {"foo": True}):
        assert _valid(recursive, x) is _valid(lower(recursive), x), x
    # A `$ref` cycle that consumes nothing: the validator recurses until referencing's Rust
    # core panics (a BaseException); the filter then leaves the schema alone.
    cycle = {"$defs": {"x": {"if": {"$ref": "#/$defs/x"}, "then": {"type": "integer"}}},
             "enum": [1, "a"], "minimum": 0, "allOf": [{"$ref": "#/$defs/x"}]}
    assert lower(cycle)["enum"] == [1, "a"]
    moved = {"$defs": {"s": {"$id": "https://example.test/s", "type": "string"}},
             "enum": ["x", 1], "$ref": "#/$defs/s"}
    assert _valid(lower(moved), "x") and not _valid(lower(moved), 1)


def test_dynamic_ref_with_one_anchor_of_its_name_resolves_as_a_ref():
    """Only one ``$dynamicAnchor`` holds the name: the dynamic scope can find no other, so
    the reference is static (dynamicRef.json group 0's shape). Two anchors of the name (a
    schema extended through its dynamic scope) stay dynamic, and are refused."""
    one = {"$id": "https://example.test/root", "type": "array",
           "items": {"$dynamicRef": "#item"},
           "$defs": {"item": {"$dynamicAnchor": "item", "type": "string"}}}
    lowered = lower(one)
    assert "$dynamic" not in json.dumps(lowered), lowered
    for x, valid in ((["a", "b"], True), ([1], False), ([], True), ("a", False)):
        assert _valid(one, x) is valid and _valid(lowered, x) is valid, (x, lowered)
    two = {"$id": "https://example.test/root", "$dynamicAnchor": "item",
           "items": {"$dynamicRef": "#item"},
           "$defs": {"inner": {"$id": "inner", "$dynamicAnchor": "item", "type": "string"}}}
    assert "$dynamicRef" in json.dumps(lower(two))


@settings(max_examples=400, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.lists(instances, min_size=1, max_size=3), st.booleans(),
       st.sampled_from([None, "object", "array", ["object", "array", "number"]]),
       st.lists(instances, min_size=6, max_size=6))
def test_objects_and_arrays_among_enum_values_are_written_as_schemas(values, as_const, kind,
                                                                     xs):
    """xgrammar matches an object or array value as its compact text only; written as a
    schema (what xgrammar compiles), the value is read by its JSON grammar, and the language
    is the same (JSON equality: 1 == 1.0, key order free, true != 1)."""
    from portable_guided.runtime.json_lowering import structured_values_text

    schema = {"const": values[0]} if as_const else {"enum": values}
    if kind is not None:
        schema["type"] = kind
    # The values themselves, and each with one property or item less.
    shorter = [dict(list(v.items())[1:]) if isinstance(v, dict) else v[1:]
               for v in values if isinstance(v, (dict, list)) and v]
    xs = [*xs, *json.loads(json.dumps(values)), *shorter]
    written = json.loads(structured_values_text(json.dumps(schema)))
    if _decisions(schema, xs) is None:
        return
    assert _decisions(written, xs) == _decisions(schema, xs), (schema, written, xs)
    if written != schema:  # rewritten: no object or array value left for xgrammar
        assert not any(isinstance(v, (dict, list)) for v in _enum_values(written)), written
        assert "allOf" not in json.dumps(written) and not (
            "anyOf" in written and len(written) > 1), written


def _enum_values(schema):
    """Every enum/const value in ``schema``, wherever it sits."""
    out = []
    stack = [schema]
    while stack:
        node = stack.pop()
        if isinstance(node, dict):
            out += node.get("enum", []) if isinstance(node.get("enum"), list) else []
            if "const" in node:
                out.append(node["const"])
            stack += [v for k, v in node.items() if k not in ("enum", "const")]
        elif isinstance(node, list):
            stack += node
    return out


@pytest.mark.parametrize("schema", [
    # Found by test_lowering_is_exact_on_random_schemas: the approximate target of the $ref
    # (its `not` narrowed to nothing) made the oneOf take every object.
    {"oneOf": [{"multipleOf": 2}, {"$ref": "#/$defs/x"}],
     "$defs": {"x": {"not": {"properties": {"a": {"uniqueItems": True}},
                             "additionalProperties": {"type": "null"}}}}},
    # The same through distribution (keywords beside the oneOf).
    {"type": "object", "oneOf": [{"minProperties": 0}, {"$ref": "#/$defs/x"}],
     "$defs": {"x": {"not": {"additionalProperties": {"type": "null"}}}}},
])
def test_a_one_of_branch_through_a_narrowed_ref_is_read_exactly(schema):
    """Every instance the approximate lowering accepts, the schema accepts (validator)."""
    instances = [{"a": None, "b": True}, {"a": None}, {}, {"b": 1}, 4, 3, "s", [1, 1], None]
    lowered = lower(schema, approximate=True)
    for x in instances:
        if jsonschema.Draft202012Validator(lowered).is_valid(x):
            assert jsonschema.Draft202012Validator(schema).is_valid(x), (x, lowered)


def test_a_one_of_branch_narrowed_to_nothing_leaves_the_others():
    """MaskBench o91584: ``not {"items": {"not": v}}`` (arrays holding v) has no form the
    engines take and narrows to ``false``; it takes arrays only, so the ``oneOf`` is proven
    disjoint, becomes ``anyOf``, and the empty branch is dropped: strings of v stay."""
    value = {"enum": ["http://www.w3.org/ns/anno.jsonld"]}
    schema = {"type": "object", "properties": {"c": {"oneOf": [
        {"$ref": "#/definitions/v"}, {"$ref": "#/definitions/a"}]}},
        "definitions": {"v": value, "a": {"not": {"items": {"not": {"$ref": "#/definitions/v"}}}}}}
    lowered = lower(schema, approximate=True)
    text = "http://www.w3.org/ns/anno.jsonld"
    assert _valid(lowered, {"c": text}) and _valid(schema, {"c": text})
    for x in ({"c": [text]}, {"c": "other"}, {"c": [text, 1]}, {"c": 1}):
        assert not _valid(lowered, x) or _valid(schema, x), (x, lowered)
    # Under oneOf, a branch whose exact form is empty is dropped too; a narrowed one is not
    # unless the branches are disjoint (it would let the others take its values).
    overlapping = {"oneOf": [{"type": "array"}, {"$ref": "#/$defs/a"}],
                   "$defs": {"a": {"not": {"items": {"type": "string"}}}}}
    narrowed = lower(overlapping, approximate=True)
    for x in ([1], ["a"], [], "s"):
        assert not _valid(narrowed, x) or _valid(overlapping, x), (x, narrowed)


# -- patternProperties that every name matches -------------------------------------------------
_EVERY = {"type": "number", "minimum": 0}
EVERY_NAME = [
    {"type": "object", "properties": {"a": {"type": "integer"}, "b": False},
     "patternProperties": {".*": _EVERY}, "additionalProperties": False},
    {"type": "object", "patternProperties": {"^.*": _EVERY}, "required": ["z"]},
    {"type": "object", "properties": {"a": {"type": "string"}}, "patternProperties": {"": {}},
     "additionalProperties": False},
    {"type": "object", "patternProperties": {"^": {"$ref": "#/$defs/n"}},
     "$defs": {"n": {"type": "integer"}}},
]
#: Kept: ``.`` stops at a line break (a name with one matches no ``^.*$``), two patterns.
NOT_EVERY_NAME = [
    {"type": "object", "patternProperties": {"^.*$": _EVERY}, "additionalProperties": False},
    {"type": "object", "patternProperties": {".*": _EVERY, "^a": {"type": "integer"}}},
]
NAME_INSTANCES = [{}, {"a": 1}, {"a": -1}, {"a": 1.5}, {"a": "x"}, {"b": 1}, {"z": 3},
                  {"z": -3}, {"a\nb": 1}, {"": 0}, {"q": 2, "r": "s"}, {"q": True}, [], 1]


@pytest.mark.parametrize("schema", EVERY_NAME + NOT_EVERY_NAME)
def test_a_pattern_every_name_matches_lowers_to_additional_properties(schema):
    lowered = lower(schema)
    every = schema in EVERY_NAME
    assert ("patternProperties" not in lowered) == every, lowered
    for x in NAME_INSTANCES:
        assert _valid(lowered, x) == _valid(schema, x), (schema, lowered, x)


def test_a_wrong_reading_of_a_line_break_would_be_caught():
    # (The reference tells ^.*$ from .*: a name with a line break matches only the second.)
    assert _valid(NOT_EVERY_NAME[0], {"a\nb": 1}) is False
    assert _valid({**NOT_EVERY_NAME[0], "patternProperties": {".*": _EVERY}}, {"a\nb": 1})


# -- patternProperties that every name but the empty or line-broken ones matches -------------
ALMOST_EVERY = [".+", "^(.)+", "^.*$", "^.+$", "(.+)", "^."]
ODD_NAMES = [{"": 1}, {"": -1}, {"\n": -1}, {"\nx": "s"}, {"a\nb": -2}]


@pytest.mark.parametrize("pattern", ALMOST_EVERY)
def test_a_pattern_almost_every_name_matches_lowers_to_a_sound_subset(pattern):
    schema = {"type": "object", "properties": {"a": {"type": "integer"}},
              "patternProperties": {pattern: _EVERY}}
    lowered = lower(schema, approximate=True)
    assert "patternProperties" not in lowered and lowered["additionalProperties"] == _EVERY
    for x in NAME_INSTANCES + ODD_NAMES:  # sound: nothing invalid accepted
        assert not _valid(lowered, x) or _valid(schema, x), (pattern, lowered, x)
    for x in NAME_INSTANCES:  # and the same language on every other name
        if not any(k == "" or "\n" in k for k in (x if isinstance(x, dict) else {})):
            assert _valid(lowered, x) == _valid(schema, x), (pattern, lowered, x)
    # what the subset leaves out: an odd name with a value outside the subschema
    assert [x for x in ODD_NAMES if _valid(schema, x) and not _valid(lowered, x)]


@pytest.mark.parametrize("schema", [
    {"type": "object", "patternProperties": {"^.+": _EVERY},
     "additionalProperties": {"type": "string"}},  # odd names have their own schema
    {"type": "object", "patternProperties": {"^.+": _EVERY}, "additionalProperties": False},
    {"type": "object", "patternProperties": {"^.+": _EVERY, "^b": {"type": "integer"}}},
    {"type": "object", "patternProperties": {"^.+x": _EVERY}},
], ids=["other-schema", "closed", "two-patterns", "not-almost-every"])
def test_a_pattern_almost_every_name_matches_is_kept_otherwise(schema):
    assert lower(schema, approximate=True)["patternProperties"] == schema["patternProperties"]


def test_a_pattern_almost_every_name_matches_is_exact_where_negated():
    schema = {"type": "object", "patternProperties": {"^.+": _EVERY}}
    assert lower(schema)["patternProperties"] == schema["patternProperties"]  # no subset asked
    negated = lower({"not": schema}, approximate=True)
    for x in NAME_INSTANCES + ODD_NAMES:
        assert not _valid(negated, x) or not _valid(schema, x), (negated, x)


# -- patternProperties names whose subschema allows anything, other names allowed -------------
_ANYTHING = {"description": "Any property starting with 'x_' is valid.",
             "additionalItems": True, "additionalProperties": True}
ALLOWS_ANYTHING = [  # (Github_medium o16744's extensions)
    {"type": "object", "properties": {"version": {"type": "integer"}},
     "patternProperties": {"^x_": _ANYTHING}},
    {"type": "object", "patternProperties": {"^x_": True, "^n_": {"type": "number"}},
     "additionalProperties": True},
]
ANYTHING_KEPT = [
    {"type": "object", "patternProperties": {"^x_": {"contains": True}}},  # a non-empty array
    {"type": "object", "patternProperties": {"^x_": _ANYTHING}, "additionalProperties": False},
    {"type": "object", "patternProperties": {"^x_": True},
     "additionalProperties": {"type": "string"}},
    {"type": "object", "patternProperties": {"^x_": True}, "unevaluatedProperties": False},
]
ANYTHING_INSTANCES = [{}, {"version": 1}, {"version": "1"}, {"x_a": [1]}, {"x_a": []},
                      {"x_a": {"b": 2}},
                      {"y": 1}, {"y": "s"}, {"n_1": 2}, {"n_1": "2"}, {"x_n_": "s"}, [], 3]


@pytest.mark.parametrize("schema", ALLOWS_ANYTHING + ANYTHING_KEPT)
def test_a_pattern_whose_subschema_allows_anything_is_dropped_where_it_changes_nothing(schema):
    lowered = lower(schema, approximate=True)
    for x in ANYTHING_INSTANCES:
        assert _valid(lowered, x) == _valid(schema, x), (schema, lowered, x)
    names = lowered.get("patternProperties", {})
    assert ("^x_" in names) == (schema in ANYTHING_KEPT), lowered


#: GeoJSON's geometry shape (MaskBench Github_medium o19022): a ``oneOf`` beside ``required``,
#: keywords of no JSON Schema draft beside both (annotations), and a ring that is an
#: ``allOf`` of a definition whose own items are a reference.
GEOMETRY = {
    "type": "object", "required": ["type", "coordinates"], "example": "../geometry.json",
    "translation": {"ISO 19115-2": ["polygon > Point"]},
    "oneOf": [
        {"type": "object", "translation": {"ISO 19115-2": ["Point"]},
         "properties": {"type": {"enum": ["Point"]},
                        "coordinates": {"$ref": "#/definitions/position"}}},
        {"type": "object", "translation": {"ISO 19115-2": ["LineString"]},
         "properties": {"type": {"enum": ["LineString"]},
                        "coordinates": {"$ref": "#/definitions/lineString"}}},
        {"type": "object", "properties": {"type": {"enum": ["Polygon"]},
                                          "coordinates": {"$ref": "#/definitions/polygon"}}},
    ],
    "definitions": {
        "position": {"type": "array", "minItems": 2, "maxItems": 3, "items": {"type": "number"}},
        "positionArray": {"type": "array", "items": {"$ref": "#/definitions/position"}},
        "lineString": {"allOf": [{"$ref": "#/definitions/positionArray"}], "minItems": 2},
        "linearRing": {"allOf": [{"$ref": "#/definitions/positionArray"}], "minItems": 4},
        "polygon": {"type": "array", "items": {"$ref": "#/definitions/linearRing"}},
    },
}
GEOMETRIES = [
    {"type": "Point", "coordinates": [1, 2]}, {"type": "Point", "coordinates": [1]},
    {"type": "Point"}, {"type": "Circle", "coordinates": [1, 2]},
    {"type": "LineString", "coordinates": [[1, 2], [3, 4]]},
    {"type": "LineString", "coordinates": [[1, 2]]},
    {"type": "LineString", "coordinates": [[1, 2], [3]]},
    {"type": "Polygon", "coordinates": [[[0, 0], [1, 0], [1, 1], [0, 0]]]},
    {"type": "Polygon", "coordinates": [[[0, 0], [1, 0], [0, 0]]]},
    {"type": "Polygon", "coordinates": []}, {"type": "Point", "coordinates": [1, 2], "x": 1},
    [], None,
]


def _subschemas(node):
    if isinstance(node, dict):
        yield node
        for v in node.values():
            yield from _subschemas(v)
    elif isinstance(node, list):
        for v in node:
            yield from _subschemas(v)


def test_unknown_keywords_and_targets_with_references_do_not_stop_a_merge():
    """A keyword of no draft is an annotation, so two values of it do not stop a merge (the
    ``oneOf`` is distributed, and its branches, disjoint on ``type``, become ``anyOf``); a
    definition whose own subschemas are references (none leading back) merges into the
    ``allOf`` beside it. Both forms decide every instance as the schema does."""
    for approximate in (False, True):
        lowered = lower(GEOMETRY, approximate=approximate)
        for x in GEOMETRIES:
            assert _valid(lowered, x) == _valid(GEOMETRY, x), (approximate, x, lowered)
    narrowed = lower(GEOMETRY, approximate=True)
    assert "anyOf" in narrowed and "oneOf" not in narrowed and "required" not in narrowed
    assert not any("allOf" in s for s in _subschemas(narrowed)), narrowed


@pytest.mark.parametrize("defs", [
    # a tree: the definition refers to itself
    {"t": {"type": "object", "properties": {"kids": {"type": "array",
                                                     "items": {"$ref": "#/$defs/t"}}}}},
    # two definitions that refer to each other
    {"t": {"type": "object", "properties": {"u": {"$ref": "#/$defs/u"}}},
     "u": {"type": "object", "properties": {"t": {"$ref": "#/$defs/t"}}}},
])
def test_a_recursive_target_beside_other_keywords_is_kept_and_lowering_ends(defs):
    """A target that refers back to itself is not merged (merging two of them need not
    end); the ``allOf`` stays, and the lowered schema decides as the schema does."""
    schema = {"$defs": defs, "minProperties": 1,
              "allOf": [{"$ref": "#/$defs/t"}, {"properties": {"kids": {"maxItems": 1}}}]}
    lowered = lower(schema, approximate=True)
    assert any("allOf" in s or "$ref" in s for s in _subschemas(lowered)), lowered
    for x in ({}, {"kids": []}, {"kids": [{}, {}]}, {"kids": [{"kids": [1]}]}, {"u": {}},
              {"u": {"t": {"u": 1}}}, {"kids": [{"u": {"t": 3}}]}, 5):
        assert _valid(lowered, x) == _valid(schema, x), (x, lowered)


@pytest.mark.parametrize("schema", [
    {"type": "array", "enum": ["code", "token"]},  # MaskBench Github_medium o20464
    {"type": "string", "enum": ["code", 1, None]},
    {"type": ["string", "null"], "enum": ["code", 1, None, [1]]},
    {"type": "integer", "const": 1.5},
    {"type": "integer", "enum": [1.0, 2, "2"]},
])
def test_values_beside_type_alone_keep_those_of_the_type(schema):
    """``enum``/``const`` beside ``type`` alone: the values of the type, or ``false`` where
    there is none (as a property: it must be absent; required: no value at all)."""
    values = schema.get("enum", [schema.get("const")])
    typed = [v for v in values if _valid({"type": schema["type"]}, v)]
    lowered = lower(schema)
    if typed:
        assert lowered["enum"] == typed, lowered
    else:
        assert lowered is False
    for x in ["code", "token", 1, 1.0, 1.5, 2, "2", None, [1], ["code"], {}]:
        assert _valid(lowered, x) == _valid(schema, x), (x, lowered)
    as_property = {"type": "object", "properties": {"p": schema}}
    for x in [{}, {"p": "code"}, {"p": 1}, {"p": None}, {"p": ["code"]}, {"q": 1}]:
        assert _valid(lower(as_property), x) == _valid(as_property, x), x
    required = {**as_property, "required": ["p"]}
    assert (lower(required) is False) == (not typed)


#: Azure's resource schemas (MaskBench Github_medium o1707): a `$ref` to a definition kept
#: under a keyword of no draft, whose own subschemas refer to `#/definitions/...`.
CUSTOM_LOCATION = {
    "$schema": "http://json-schema.org/draft-04/schema#",
    "tenant_resourceDefinitions": {"group": {
        "type": "object", "required": ["name"],
        "properties": {"name": {"type": "string"},
                       "resources": {"type": "array", "items": {"oneOf": [
                           {"$ref": "#/definitions/child"}]}}}}},
    "definitions": {"child": {"type": "object", "required": ["type"],
                              "properties": {"type": {"enum": ["subscriptions"]}}}},
    "type": "object", "required": ["group"],
    "properties": {"group": {"$ref": "#/tenant_resourceDefinitions/group"},
                   "child": {"$ref": "#/definitions/child"}},
}
CUSTOM_LOCATION_INSTANCES = [
    {"group": {"name": "g"}}, {"group": {"name": "g", "resources": [{"type": "subscriptions"}]}},
    {"group": {"name": "g", "resources": [{"type": "x"}]}}, {"group": {"name": "g",
                                                                       "resources": [{}]}},
    {"group": {}}, {"group": {"name": "g"}, "child": {"type": "subscriptions"}},
    {"group": {"name": "g"}, "child": {}}, {}]


def test_references_inside_a_target_at_a_custom_location_are_resolved():
    """A target under a keyword of no draft is hoisted with the references inside it
    resolved too: they named `#/definitions/...`, which hoisting drops, so xgrammar failed
    ("Cannot find field definitions"). The lowered schema decides as the schema does."""
    lowered = lower(CUSTOM_LOCATION)
    refs = [s["$ref"] for s in _subschemas(lowered) if isinstance(s, dict) and "$ref" in s]
    assert refs and all(r.startswith("#/$defs/pg") for r in refs), refs
    assert "definitions" not in json.dumps(lowered).replace("tenant_resourceDefinitions", "")
    for x in CUSTOM_LOCATION_INSTANCES:
        assert _valid(lowered, x) == _valid(CUSTOM_LOCATION, x), (x, lowered)
