"""Invalid texts that random walks through the mask found (harness/generation.py), pinned:
our runtime never lets a model write them on any engine (the control characters: raw
xgrammar writes them; the unquoted name came from our lowering's split by type)."""

from __future__ import annotations

import json

import pytest
from runtime_helpers import decide_text

# (schema, a text that is not valid JSON for it)
CASES = {
    # xgrammar 0.2.8 writes a control character named in a pattern raw inside the string.
    "tab escape": ({"type": "string", "pattern": "^a\\tb$"}, '"a\tb"'),
    "control escape": ({"type": "string", "pattern": "^a\\cIb$"}, '"a\tb"'),
    "unicode escape": ({"type": "string", "pattern": "^a\\u0009b$"}, '"a\tb"'),
    # xgrammar 0.2.8 wrote names from a propertyNames branch of another type unquoted (the
    # lowering had split `{"pattern": ...}` by type; it now types names as strings).
    "propertyNames": ({"type": "object", "propertyNames": {"pattern": "^a+$"}},
                      '{"aa": 1, 2: 3}'),
    # Both engines count pairs: a repeated name met minProperties (MaskBench o48619, a
    # llguidance walk); a parser keeps one name, so the object has one property.
    "repeated name": ({"type": "object", "minProperties": 2}, '{"a": 1, "a": 2}'),
    # xgrammar 0.2.8 ignores an anchor inside a pattern ("Anchor '$' in the middle of regex
    # is ignored"): `a$b` matches no string, read without the anchor it matches "ab".
    "interior anchor": ({"type": "string", "pattern": "^a$b$"}, '"ab"'),
}


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("engine", ["xgrammar", "llguidance", "auto"])
def test_an_invalid_text_is_never_accepted(runtimes, engine, case):
    schema, text = CASES[case]
    assert decide_text(runtimes[engine], schema, text) in (None, False)


@pytest.mark.parametrize("case", sorted(set(CASES) - {"propertyNames"}))
def test_raw_xgrammar_accepts_it(deepseek, case):
    """Why the runtime refuses these on xgrammar: the library itself (JSON Schema's open
    objects, ``strict_mode=False``) accepts the text; if a newer xgrammar stops, the refusal
    can go."""
    xgr = pytest.importorskip("xgrammar")

    from portable_guided.runtime.engines import xgrammar as xgr_engine

    schema, text = CASES[case]
    compiler = xgr.GrammarCompiler(xgr_engine.tokenizer(deepseek))
    grammar = compiler.compile_json_schema(json.dumps(schema), strict_mode=False)
    matcher = xgr.GrammarMatcher(grammar)
    assert all(matcher.accept_token(t) for t in deepseek.encode(text)), (case, text)
    assert matcher.accept_token(deepseek.stop_token_ids[0])


@pytest.mark.parametrize(("schema", "refused"), [
    ({"type": "object", "minProperties": 2}, True),
    ({"minProperties": 3, "required": ["a", "b"], "additionalProperties": {"type": "integer"}},
     True),
    ({"minProperties": 2, "patternProperties": {"^x": {}}, "additionalProperties": False},
     True),
    ({"minProperties": 1}, False),  # any pair is one name
    ({"minProperties": 2, "required": ["a", "b"]}, False),
    ({"minProperties": 2, "required": ["a", "a"]}, True),  # one name, required twice
    ({"minProperties": 2, "properties": {"a": {}, "b": {}, "c": {}},
      "additionalProperties": False}, False),  # declared names are written once each
])
def test_min_properties_a_repeated_name_could_meet_is_refused(schema, refused):
    from portable_guided.json_schema.refusals import unsound

    reasons = unsound(schema)
    assert bool(reasons) is refused, reasons
    assert not refused or "minProperties" in reasons[0]


@pytest.mark.parametrize(("pattern", "interior"), [
    ("^a+$", False), ("^$|^(a)$", False), ("^a|b$", False), ("^[$^]+$", False),
    ("^a\\$b$", False), ("^a$|^b$|^$", False),
    ("a$b", True), ("^a(^b)$", True), ("^(a|b$)$", True), ("$a", True), ("a^", True),
])
def test_interior_anchors_are_found(pattern, interior):
    from portable_guided.json_schema.xgrammar_patterns import interior_anchor

    assert interior_anchor(pattern) is interior
