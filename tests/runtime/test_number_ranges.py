"""Number ranges: our xgrammar rules (``xgrammar_exact``) against exact decimal
comparison; xgrammar deciding ranged numbers as the ``jsonschema`` validator does where its
own ranges stop at 6 fraction digits (MaskBench o3914, o45806); llguidance refusing the ranges
it builds too wide (``json_semantics.llguidance_unsupported``)."""

from __future__ import annotations

import json
import re
from decimal import Decimal

import pytest
from runtime_helpers import decide_text

from portable_guided.runtime import GrammarSpec
from portable_guided.runtime.engines.base import UnsupportedSpec
from portable_guided.runtime.json_semantics import llguidance_exact_numbers, llguidance_unsupported
from portable_guided.runtime.xgrammar_exact import (
    exact_placeholders,
    range_rules,
    substitute_exact,
)

xgr = pytest.importorskip("xgrammar")
jsonschema = pytest.importorskip("jsonschema")
pytest.importorskip("hypothesis")
st = pytest.importorskip("hypothesis.strategies")
from hypothesis import HealthCheck, given, settings
from xgrammar.testing import _is_grammar_accept_string

_PLAIN_NUMBER = re.compile(r"-?(0|[1-9][0-9]*)(\.[0-9]+)?\Z")


def _in_range(text: str, low, high) -> bool:
    """The reference: plain JSON number syntax, then exact decimal comparison."""
    if not _PLAIN_NUMBER.match(text):
        return False
    value = Decimal(text)
    if low is not None and not (value > low[0] if low[1] else value >= low[0]):
        return False
    return high is None or (value < high[0] if high[1] else value <= high[0])


_decimals = st.builds(lambda n, e: Decimal(n).scaleb(-e),
                      st.integers(-10**7, 10**7), st.integers(0, 8))
_bounds = st.none() | st.tuples(_decimals, st.booleans())
# Number-like texts: a sign, a whole part (sometimes with a leading zero, not JSON), an
# optional fraction of up to 10 digits (sometimes empty: "1.", not JSON).
_texts = st.builds(
    lambda sign, zero, whole, frac: sign + ("0" if zero else "") + str(whole) + frac,
    st.sampled_from(["", "-"]), st.booleans(), st.integers(0, 10**8),
    st.just("") | st.text("0123456789", max_size=10).map(lambda d: "." + d))


def _near(bound) -> list[str]:
    """Texts at and just around a bound (where a wrong rule shows first)."""
    if bound is None:
        return []
    plain = format(bound[0], "f")
    unsigned = plain.lstrip("-")
    out = [plain, plain + ("0" if "." in plain else ".0"), plain + ("1" if "." in plain
                                                                    else ".0000001"),
           "-" + unsigned, unsigned]
    whole, _, frac = unsigned.partition(".")
    if frac:
        out.append(("-" if plain.startswith("-") else "") + whole + "." + frac[:-1])
    return out


@settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck))
@given(low=_bounds, high=_bounds, texts=st.lists(_texts, min_size=5, max_size=15))
def test_range_rules_decide_as_decimal_comparison(low, high, texts):
    try:
        rules = range_rules("root", low, high)
    except UnsupportedSpec:
        assert low is not None and high is not None and (
            low[0] > high[0] or low[0] == high[0] and (low[1] or high[1])), (low, high)
        return
    grammar = xgr.Grammar.from_ebnf(rules)
    for text in [*texts, *_near(low), *_near(high), "0", "-0", "-0.0", "1e2", "01", "1."]:
        assert _is_grammar_accept_string(grammar, text) == _in_range(text, low, high), (
            low, high, text)


def _placeholder() -> tuple[str, dict[str, str]]:
    """This process's first placeholder text and its rules (the text has a random part)."""
    rules: dict[str, str] = {}
    exact_placeholders('{"type": "number", "minimum": 0}', rules)
    (literal,) = rules
    return json.loads(json.loads(literal)), rules


def test_a_placeholder_in_an_unforeseen_form_refuses():
    placeholder, rules = _placeholder()
    quoted = json.dumps(json.dumps(placeholder))
    assert "pg_number_0 ::=" in substitute_exact(f"root ::= {quoted}", rules)
    with pytest.raises(UnsupportedSpec, match="not foreseen"):
        substitute_exact(f'root ::= "{placeholder}"', rules)


# (schema, texts): MaskBench o3914/o45806's shapes and the forms around them.
RANGES = [
    ({"type": "number", "minimum": 0, "maximum": 1},
     ["0.1234567", "0.0000001", "0.00000012", "1", "1.0000000", "1.0000001", "-0.1", "0",
      "-0", "-0.0"]),
    ({"type": "number", "exclusiveMinimum": 0, "exclusiveMaximum": 0.5, "title": "t"},
     ["0.4999999999", "0.5", "0", "0.0", "0.000000001", "0.25"]),
    ({"type": "number", "minimum": -180.0, "maximum": 180.0},
     ["-179.12345678", "180.00000001", "-180", "12.3456789012"]),
    ({"type": ["number", "null"], "minimum": 0.1},
     ["null", "0.10000001", "0.09999999", "12345678.123456789"]),
    ({"type": "number", "minimum": -2.5, "exclusiveMaximum": -2},
     ["-2", "-2.0000001", "-2.5", "-2.5000001", "-1.9"]),
    ({"type": "object", "properties": {"lat": {"type": "number", "minimum": -90,
                                               "maximum": 90}},
      "required": ["lat"], "additionalProperties": False},
     ['{"lat": 45.123456789}', '{"lat": 90.0000001}', '{"lat": -90}']),
    ({"type": "array", "items": {"type": "number", "minimum": 2.5}},
     ["[2.5000001, 3]", "[2.4999999]", "[]"]),
    # llguidance's own range leaves out values whose digits stop inside a fractional bound's
    # (56.5 under 56.52): they are added beside it (json_semantics.llguidance_exact_numbers)
    ({"type": "number", "minimum": 33.84, "maximum": 56.52},
     ["56.5", "56.52", "56.520", "56.53", "56", "33.8", "33.84", "33.9"]),
    ({"type": "number", "exclusiveMinimum": -41.56, "exclusiveMaximum": -4.229},
     ["-41.5", "-41.56", "-41.57", "-4.2", "-4.22", "-4.23", "-4.229", "-10"]),
    ({"type": "number", "minimum": 0.5688, "maximum": 0.5699},
     ["0.5", "0.56", "0.569", "0.5688", "0.5699"]),
]


@pytest.mark.parametrize("index", range(len(RANGES)))
def test_ranged_numbers_decide_as_json_schema(index, runtimes):
    schema, texts = RANGES[index]
    check = jsonschema.Draft202012Validator(schema)
    for text in texts:
        expected = check.is_valid(json.loads(text))
        assert decide_text(runtimes["xgrammar"], schema, text) == expected, (schema, text)
        # llguidance (auto's first choice) refuses or decides the same, but where it is
        # narrower: it never takes "-0" in a range, nor a zero past a bound's last digit
        narrower = text in ("-0", "-0.0", "56.520")
        for engine in ("llguidance", "auto"):
            decided = decide_text(runtimes[engine], schema, text)
            assert decided in ((None, False) if narrower else (None, expected)), (
                engine, schema, text, decided)


# Ranges llguidance builds one value too wide: (schema, the excluded value it accepts).
LLGUIDANCE_HOLES = [
    ({"type": "number", "exclusiveMinimum": 0, "maximum": 0.5}, "0"),
    ({"type": "number", "exclusiveMinimum": 1, "exclusiveMaximum": 1.065}, "1"),
    ({"type": "number", "minimum": -2.5, "exclusiveMaximum": -2}, "-2"),
    ({"type": "number", "minimum": -0.4, "exclusiveMaximum": 0}, "-0"),
]


@pytest.mark.parametrize("index", range(len(LLGUIDANCE_HOLES)))
def test_llguidance_refuses_the_ranges_it_builds_too_wide(index, runtimes, deepseek):
    from portable_guided.runtime.engines.llguidance import LLGuidanceEngine

    schema, excluded = LLGUIDANCE_HOLES[index]
    assert not jsonschema.Draft202012Validator(schema).is_valid(json.loads(excluded))
    # llguidance itself (as vLLM's guidance backend calls it) accepts the excluded value:
    # this fails once an upgrade fixes it, and the refusal can go.
    engine = LLGuidanceEngine.create(deepseek)
    matcher = engine.new_matcher(engine.compile_raw(GrammarSpec.json_schema(schema)))
    ids = deepseek.encode(excluded)
    assert all(matcher.accept(t) for t in ids) and matcher.accept(deepseek.stop_token_ids[0])
    # ours refuses it, and auto falls back to xgrammar
    assert decide_text(runtimes["llguidance"], schema, excluded) is None
    assert decide_text(runtimes["auto"], schema, excluded) is False


@settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck))
@given(low=_bounds, high=_bounds, keys=st.tuples(st.booleans(), st.booleans()),
       other=st.sampled_from([{}, {"title": "t"}, {"multipleOf": 0.01}]))
def test_llguidance_values_beside_a_range_are_within_it(low, high, keys, other):
    node: dict = {"type": "number", **other}
    for bound, key in ((low, ("minimum", "exclusiveMinimum")),
                       (high, ("maximum", "exclusiveMaximum"))):
        if bound is not None:
            node[key[bound[1]]] = float(bound[0])
    text = json.dumps(node)
    out = json.loads(llguidance_exact_numbers(json.loads(text), text))
    if out == node:
        return
    assert "multipleOf" not in node  # only plain ranges get values beside
    assert out["anyOf"][0] == node
    check = jsonschema.Draft202012Validator(node)
    assert out["anyOf"][1]["enum"] and all(check.is_valid(v) for v in out["anyOf"][1]["enum"])


def test_llguidance_rule_leaves_sound_ranges_alone():
    for schema in [{"type": "number", "exclusiveMinimum": 0, "maximum": 1},
                   {"type": "number", "exclusiveMinimum": 0.5, "maximum": 0.7},
                   {"type": "number", "minimum": 0, "maximum": 0.5},
                   {"type": "number", "minimum": -3, "exclusiveMaximum": -2},
                   {"type": "integer", "exclusiveMinimum": 0, "maximum": 0.5}]:
        assert llguidance_unsupported(schema, json.dumps(schema)) == [], schema
    for schema, _ in LLGUIDANCE_HOLES:
        assert llguidance_unsupported(schema, json.dumps(schema)), schema


def test_tool_call_numbers_take_every_fraction_digit(runtimes):
    spec = GrammarSpec.structural_tag(
        [{"begin": "<function=f>", "end": "</function>",
          "schema": {"type": "object", "properties": {"x": {"type": "number", "minimum": 0,
                                                            "maximum": 1}},
                     "required": ["x"]}}], ["<function="])
    for arguments, expected in [('{"x": 0.12345678}', True), ('{"x": 1.00000001}', False)]:
        req = runtimes["xgrammar"].new_request(spec, on_error="reject").wait(60)
        ids = runtimes["xgrammar"].info.encode(f"Calling: <function=f>{arguments}</function>")
        assert (req.accept_tokens(ids) == len(ids)) == expected, arguments


def test_a_schema_holding_the_placeholder_text_keeps_xgrammars_range(runtimes):
    schema = {"type": "number", "minimum": 0, "maximum": 1, "description": _placeholder()[0]}
    assert exact_placeholders(json.dumps(schema), {}) == json.dumps(schema)
    assert decide_text(runtimes["xgrammar"], schema, "0.5") is True
    assert decide_text(runtimes["xgrammar"], schema, "1.5") is False


def _places_ok(text: str, places: int) -> bool:
    return len(text.partition(".")[2]) <= places


@settings(max_examples=200, deadline=None, suppress_health_check=list(HealthCheck))
@given(low=_bounds, high=_bounds, places=st.integers(1, 4),
       texts=st.lists(_texts, min_size=5, max_size=15))
def test_range_rules_with_places_decide_as_decimals_of_that_many_digits(low, high, places,
                                                                          texts):
    try:
        rules = range_rules("root", low, high, places=places)
    except UnsupportedSpec:
        assert low is not None and high is not None, (low, high, places)
        # no decimal of `places` digits in the range (the reference agrees on a grid)
        step = Decimal(1).scaleb(-places)
        start = (low[0] / step).to_integral_value(rounding="ROUND_FLOOR")
        for i in range(int(start) - 1, int(start) + 1 + int((high[0] - low[0]) / step) + 1):
            assert not _in_range(format(i * step, "f"), low, high), (low, high, places, i)
        return
    grammar = xgr.Grammar.from_ebnf(rules)
    for text in [*texts, *_near(low), *_near(high), "0", "-0", "0.1", "0.10", "0.100",
                 "1.2345", "1e2", "1."]:
        expected = _in_range(text, low, high) and _places_ok(text, places)
        assert _is_grammar_accept_string(grammar, text) == expected, (low, high, places, text)


# multipleOf 10**-k on numbers (MaskBench o17482, o17460, o41773: amounts of money), which
# xgrammar ignores: our rule, the decimals of at most k fraction digits in the range (a
# sound subset: "1.500" and "15e-1" are multiples too; llguidance's language is the same).
MULTIPLES = [
    ({"type": "number", "multipleOf": 0.01}, ["1.5", "1.50", "1.505", "-0.01", "0", "12.34"]),
    ({"type": "number", "multipleOf": 0.01, "minimum": 0, "title": "amount"},
     ["0", "0.01", "-0.01", "99999999.99", "0.001", "3"]),
    ({"type": "number", "multipleOf": 0.1, "exclusiveMinimum": 0.05, "maximum": 2.5},
     ["0.1", "0.05", "0", "2.5", "2.6", "1.25", "1"]),
    ({"type": ["number", "null"], "multipleOf": 0.001, "maximum": -1},
     ["null", "-1", "-1.001", "-1.0001", "-0.999", "-1000"]),
    ({"type": "object", "properties": {"price": {"type": "number", "multipleOf": 0.01,
                                                 "minimum": 0}},
      "required": ["price"]},
     ['{"price": 10.99}', '{"price": 10.999}', '{"price": -1}']),
]


def _without_multiple_of(schema):
    if isinstance(schema, dict):
        return {k: _without_multiple_of(v) for k, v in schema.items() if k != "multipleOf"}
    return schema


def _multiple_of(schema, value) -> bool:
    """JSON Schema's multipleOf on the decimal as written (jsonschema divides floats)."""
    step = Decimal(repr(schema["multipleOf"]))
    return value is None or (Decimal(repr(value)) % step) == 0


@pytest.mark.parametrize("index", range(len(MULTIPLES)))
def test_decimal_multiples_decide_as_json_schema_on_xgrammar(index, runtimes):
    schema, texts = MULTIPLES[index]
    number = schema["properties"]["price"] if "properties" in schema else schema
    check = jsonschema.Draft202012Validator(_without_multiple_of(schema))
    for text in texts:
        value = json.loads(text)
        inner = value["price"] if isinstance(value, dict) else value
        expected = check.is_valid(value) and _multiple_of(number, inner)
        for engine in ("xgrammar", "llguidance"):  # one language: hand-overs keep working
            assert decide_text(runtimes[engine], schema, text) == expected, (
                engine, schema, text)


def test_other_multiples_of_numbers_are_still_refused_by_xgrammar():
    from portable_guided.json_schema.refusals import xgrammar_unsupported

    for schema in [{"type": "number", "multipleOf": 0.25}, {"type": "number", "multipleOf": 3},
                   {"type": "number", "multipleOf": 0.01, "minLength": 2},
                   {"multipleOf": 0.01}]:
        assert xgrammar_unsupported(schema), schema
    assert not xgrammar_unsupported({"type": "number", "multipleOf": 0.01, "maximum": 5})


def test_a_multiple_of_one_on_an_integer_constrains_nothing_on_xgrammar(runtimes):
    # MaskBench Github_trivial o41773: multipleOf 1.0 beside a minimum (every integer is one)
    schema = {"type": "integer", "multipleOf": 1.0, "minimum": 0}
    for text, expected in (("0", True), ("7", True), ("-1", False), ("1.5", False)):
        assert decide_text(runtimes["xgrammar"], schema, text) is expected, text
