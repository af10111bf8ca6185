"""Strings with a short ``minLength`` on xgrammar: our rule (``xgrammar_exact``) against the
character count JSON Schema defines, escapes included (xgrammar 0.2.8's own rule, and the
pattern that replaced it, have no escapes: MaskBench o71820's ``"\\r\\n"`` was refused)."""

from __future__ import annotations

import json

import pytest
from runtime_helpers import decide_text

from portable_guided.runtime.xgrammar_exact import min_length_rules
from portable_guided.runtime.xgrammar_patterns import MAX_ESCAPED_MIN_LENGTH

xgr = pytest.importorskip("xgrammar")
jsonschema = pytest.importorskip("jsonschema")
pytest.importorskip("hypothesis")
st = pytest.importorskip("hypothesis.strategies")
from hypothesis import HealthCheck, given, settings
from xgrammar.testing import _is_grammar_accept_string


def _expected(text: str, min_length: int) -> bool:
    """The reference: strict JSON, a string, at least ``min_length`` code points, none a
    lone surrogate (not a character: the rule leaves it out)."""
    try:
        value = json.loads(text)
    except ValueError:
        return False
    if not isinstance(value, str) or any(0xD800 <= ord(c) <= 0xDFFF for c in value):
        return False
    return len(value) >= min_length


_chars = st.characters(codec="utf-8") | st.sampled_from(
    ['"', "\\", "\n", "\t", "\x00", "\x1f", "/", "é", "😀", "\ud83d"])
_broken = st.sampled_from(['"a\tb"', '"\\q"', '"\\u12"', '"a', 'a"', '"\\ud83d"',
                           '"\\ud83d\\u0041"', '"\\ude00"', '""', '"\\/"', '"\\u00E9x"'])


@settings(max_examples=400, deadline=None, suppress_health_check=list(HealthCheck))
@given(min_length=st.integers(1, 5), value=st.text(_chars, max_size=8), ascii=st.booleans(),
       broken=_broken)
def test_min_length_rule_counts_characters_as_json_schema(min_length, value, ascii, broken):
    grammar = xgr.Grammar.from_ebnf(min_length_rules("root", min_length))
    for text in (json.dumps(value, ensure_ascii=ascii), broken):
        assert _is_grammar_accept_string(grammar, text) == _expected(text, min_length), (
            min_length, text)


@pytest.mark.parametrize("schema", [
    {"type": "string", "minLength": 1},
    {"type": "string", "minLength": MAX_ESCAPED_MIN_LENGTH, "title": "t"},
    {"type": ["string", "null"], "minLength": 2},
    {"type": "object", "properties": {"d": {"type": "string", "minLength": 3}},
     "required": ["d"], "additionalProperties": False},
])
def test_xgrammar_writes_escapes_in_short_min_length_strings(schema, runtimes):
    check = jsonschema.Draft202012Validator(schema)
    values = ["GET / HTTP/1.1\r\n", 'say "hi"', "a\\b", "", "ab", "x" * MAX_ESCAPED_MIN_LENGTH,
              "\t" * 20, None]
    if schema.get("type") == "object":
        values = [{"d": v} for v in values]
    for value in values:
        text = json.dumps(value)
        expected = check.is_valid(value)
        assert decide_text(runtimes["xgrammar"], schema, text) == expected, (schema, text)


def test_longer_min_lengths_keep_the_pattern(runtimes):
    # Above the limit the pattern stays (no escapes: a subset), for compile time.
    schema = {"type": "string", "minLength": MAX_ESCAPED_MIN_LENGTH + 1}
    assert decide_text(runtimes["xgrammar"], schema, json.dumps("y" * 40)) is True
    assert decide_text(runtimes["xgrammar"], schema, json.dumps("y" * 40 + "\n")) is False
