"""Both engines, through the runtime, on every spec kind; masks checked against references
computed from the tokenizer's own token strings."""

from __future__ import annotations

import json

import jsonschema
import numpy as np
import pytest
from runtime_helpers import allowed, is_allowed

from portable_guided.runtime import GrammarCompileError, GrammarRejectedToken, GrammarSpec


@pytest.fixture(scope="session")
def token_strings(deepseek):
    """Decoded text of every token (the independent reference for prefix tests)."""
    return [deepseek.decode([i]) for i in range(deepseek.tokenizer_vocab_size)]


def walk(rt, spec, text):
    """Fill a mask before each token of ``text`` and accept it; returns tokens accepted."""
    info = rt.info
    req = rt.new_request(spec).wait(60)
    assert not req.failed, req.error
    bm = rt.allocate_bitmask(1)
    ids = info.encode(text)
    for i, t in enumerate(ids):
        rt.fill_bitmask([req], bm)
        if not is_allowed(bm[0], t):
            return i, req
        assert req.accept(t)
    return len(ids), req


CASES = [
    (GrammarSpec.json_schema({"type": "object", "properties": {"a": {"type": "integer"}},
                              "required": ["a"]}), '{"a": 12}', '{"a": "x"}'),
    (GrammarSpec.any_json(), '{"k": [1, null, {"z": true}]}', '[1, 2]'),
    (GrammarSpec.regex(r"[0-9]{3}-[a-z]+"), "123-abc", "12-abc"),
    (GrammarSpec.ebnf('root ::= "a" num\nnum ::= [0-9]+'), "a2024", "b2024"),
    (GrammarSpec.choice(['say "hi"', "no way"]), 'say "hi"', "no"),
    (GrammarSpec.structural_tag(
        [{"begin": "<function=get>", "schema": {"type": "object", "properties": {
            "city": {"type": "string"}}, "required": ["city"]}, "end": "</function>"}],
        ["<function="]),
     'Let me check. <function=get>{"city": "Paris"}</function> Done.',
     'x <function=get>{"town": 1}</function>'),
]


@pytest.mark.parametrize("spec,good,bad", CASES, ids=[c[0].kind for c in CASES])
def test_valid_accepted_invalid_rejected(rt, spec, good, bad):
    n, req = walk(rt, spec, good)
    assert n == len(rt.info.encode(good))
    if spec.kind != "structural_tag":  # free text may go on after a tool call
        assert req.accept(rt.info.stop_token_ids[0]) and req.is_terminated
    n_bad, _ = walk(rt, spec, bad)
    if spec.kind in ("choice",):  # "no" is a valid prefix of "no way": may not end there
        req2 = walk(rt, spec, bad)[1]
        with pytest.raises(GrammarRejectedToken):
            req2.accept(rt.info.stop_token_ids[0])
    else:
        assert n_bad < len(rt.info.encode(bad))


def test_choice_first_mask_matches_reference(rt, token_strings):
    # At the start of a choice among ASCII strings, a token is allowed exactly when its text
    # is a non-empty prefix of some choice (computed here from the raw token strings).
    choices = ["yes", "no", "maybe later"]
    req = rt.new_request(GrammarSpec.choice(choices)).wait(60)
    bm = rt.allocate_bitmask(1)
    rt.fill_bitmask([req], bm)
    got = set(allowed(bm[0], rt.vocab_size).tolist())
    want = {i for i, s in enumerate(token_strings)
            if s and s.isascii() and any(c.startswith(s) for c in choices)}
    # Special tokens decode to their names; none is a prefix of these choices.
    assert got == want


def test_engines_agree_on_json_masks(runtimes):
    # The two engines are independent implementations: on a schema both support fully, their
    # masks along a valid instance must coincide token for token.
    schema = {"type": "object", "properties": {"id": {"type": "integer"},
              "tags": {"type": "array", "items": {"type": "string", "enum": ["a", "b"]}}},
              "required": ["id", "tags"], "additionalProperties": False}
    text = json.dumps({"id": 7, "tags": ["a", "b"]})
    jsonschema.validate(json.loads(text), schema)
    spec = GrammarSpec.json_schema(schema)
    reqs = {n: runtimes[n].new_request(spec).wait(60) for n in ("xgrammar", "llguidance")}
    info = runtimes["xgrammar"].info
    for t in info.encode(text):
        masks = {}
        for n, req in reqs.items():
            bm = runtimes[n].allocate_bitmask(1)
            runtimes[n].fill_bitmask([req], bm)
            masks[n] = bm[0].copy()
            assert req.accept(t)
        a = set(allowed(masks["xgrammar"], info.vocab_size).tolist())
        b = set(allowed(masks["llguidance"], info.vocab_size).tolist())
        assert t in a and t in b
        # llguidance allows only the canonical token where a key is forced ("id" but not
        # "i"); otherwise the sets may differ only in whitespace tokens.
        b_text = [info.decode([i]) for i in b]
        for i in a - b:
            s = info.decode([i])
            assert s.strip() == "" or any(o.startswith(s) and o != s for o in b_text), s
        for i in b - a:
            assert info.decode([i]).strip() == "", info.decode([i])


def test_compile_error_has_reason(rt):
    req = rt.new_request(GrammarSpec.ebnf('root ::= "a" undefined_rule')).wait(60)
    assert req.failed and isinstance(req.error, GrammarCompileError)
    assert "undefined_rule" in str(req.error)
    bm = rt.allocate_bitmask(1)
    rt.fill_bitmask([req], bm)  # a failed request allows only its stop tokens
    assert allowed(bm[0], rt.vocab_size).tolist() == list(rt.info.stop_token_ids)
    assert np.all(bm[0][1:] == 0)


def test_xgrammar_compiler_cache_keeps_every_mask(deepseek):
    """Our xgrammar engine compiles with xgrammar's cache on (masks shared between grammars
    made a new small schema ~9x faster): after other schemas warmed that cache, each
    grammar's masks along a valid instance equal those of a fresh cache-less
    ``xgrammar.GrammarCompiler`` compiling the same schema text."""
    import xgrammar as xgr

    from portable_guided.runtime.engines import create_engine
    from portable_guided.runtime.json_lowering import engine_schema_text

    engine = create_engine("xgrammar", deepseek)
    plain = xgr.GrammarCompiler(engine.tokenizer_info, max_threads=1, cache_enabled=False)
    cases = [
        ({"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
          "required": ["name", "age"]}, {"name": "Ada", "age": 36}),
        ({"type": "object", "properties": {"city": {"type": "string"}, "temp": {"type": "number"},
          "unit": {"enum": ["C", "F"]}}, "required": ["city"]}, {"city": "Oslo", "unit": "C"}),
        ({"type": "array", "items": {"type": "object", "properties": {"id": {"type": "integer"},
          "tag": {"type": "string"}}}}, [{"id": 1, "tag": "x y"}, {"id": 22}]),
        ({"type": "object", "properties": {"ok": {"type": "boolean"},
          "note": {"type": ["string", "null"]}}}, {"ok": False, "note": None}),
    ]
    bitmask = np.zeros((2, (deepseek.vocab_size + 31) // 32), dtype=np.int32)
    for schema, instance in cases * 2:  # the second pass compiles with a warm cache
        jsonschema.validate(instance, schema)
        spec = GrammarSpec.json_schema(schema, strict=True)
        ours = engine.new_matcher(engine.compile(spec))
        text = engine_schema_text(spec.engine_schema_text())
        theirs = xgr.GrammarMatcher(plain.compile_json_schema(
            text, any_whitespace=True, strict_mode=False))
        for token in [*deepseek.encode(json.dumps(instance)), deepseek.stop_token_ids[0]]:
            ours.fill(bitmask, 0)
            theirs.fill_next_token_bitmask(bitmask, 1)
            np.testing.assert_array_equal(bitmask[0], bitmask[1])
            assert ours.accept(token) and theirs.accept_token(token)
        assert ours.is_terminated() and theirs.is_terminated()


def test_xgrammar_forget_drops_the_compiler_cache(deepseek):
    """A grammar the runtime discards (an engine failed on it mid-request) is built anew
    on the next compile, not handed back by xgrammar's cache."""
    from portable_guided.runtime.engines import create_engine

    engine = create_engine("xgrammar", deepseek)
    spec = GrammarSpec.json_schema({"type": "object", "properties": {"a": {"type": "integer"}}})
    first = engine.compile(spec)
    assert engine._compiler.get_cache_size_bytes() > 0
    engine.forget(first)
    assert engine._compiler.get_cache_size_bytes() == 0


XGRAMMAR_TAG = {"type": "structural_tag", "format": {
    "type": "triggered_tags", "triggers": ["<tool_call>"], "at_least_one": True,
    "tags": [{"type": "tag", "begin": "<tool_call>", "end": "</tool_call>", "content": {
        "type": "json_schema", "json_schema": {
            "type": "object", "properties": {"b": {"type": "integer"}, "a": {"type": "string"}},
            "required": ["b", "a"]}}}]}}


def test_xgrammar_structural_tag_is_xgrammars_own_compile(runtimes):
    """xgrammar's own structural tag, handed over as written: llguidance refuses it, the
    xgrammar engine's masks equal xgrammar's own matcher on its own compile at every token
    (the property order as written, at_least_one)."""
    import xgrammar as xgr

    from portable_guided.runtime.engines.xgrammar import tokenizer

    spec = GrammarSpec.xgrammar_structural_tag(XGRAMMAR_TAG)
    with pytest.raises(GrammarCompileError, match="xgrammar only"):
        runtimes["llguidance"].compile(spec)
    rt = runtimes["xgrammar"]
    info = rt.info
    own = xgr.GrammarMatcher(xgr.GrammarCompiler(tokenizer(info)).compile_structural_tag(
        json.dumps(XGRAMMAR_TAG)))
    expected = xgr.allocate_token_bitmask(1, info.vocab_size).numpy()
    req = rt.new_request(spec).wait(60)
    bm = rt.allocate_bitmask(1)
    text = '<tool_call>{"b": 1, "a": "x"}</tool_call>'
    for t in [*info.encode(text), info.stop_token_ids[0]]:
        rt.fill_bitmask([req], bm)
        own.fill_next_token_bitmask(expected)
        assert np.array_equal(bm[0], expected[0])
        assert req.accept(t) and own.accept_token(t)
    assert req.is_terminated
    # Written order only ("a" before "b" is refused), and a tag is required.
    for bad in ('<tool_call>{"a": "x", "b": 1}</tool_call>', "Hello"):
        assert walk(rt, spec, bad)[0] < len(info.encode(bad))
