"""The start state's mask and the masks after each of its few tokens, computed with the
compile (``CompiledGrammar.first_mask``, ``second_masks``): a request's first and second
fills, batched or single, copy them; the reference is a fresh matcher of the engine filling
the row itself."""

from __future__ import annotations

import time

import numpy as np
import pytest
from runtime_helpers import allowed

from portable_guided.runtime import GrammarRuntime, GrammarSpec, ReasoningConfig
from portable_guided.runtime.compile_service import SECOND_MASKS_MAX

SPECS = {
    "object": GrammarSpec.json_schema({"type": "object", "properties": {"a": {"type": "integer"}},
                                       "required": ["a"]}),
    "array": GrammarSpec.json_schema({"type": "array", "items": {"type": "string"}}),
    "regex": GrammarSpec.regex(r"(ab|cd)+[0-9]"),
    "choice": GrammarSpec.choice(["left", "right"]),
    "ebnf": GrammarSpec.ebnf('root ::= "x" [0-9]+'),
}
TEXTS = {"object": '{"a": 12}', "array": '["p", "q"]', "regex": "abcd7", "choice": "right",
         "ebnf": "x42"}


def engine_first_mask(rt, compiled, tokens=()) -> np.ndarray:
    """What a fresh matcher of the grammar's engine writes into a row after ``tokens`` (no
    copy involved)."""
    matcher = compiled.engine.new_matcher(compiled.grammar)
    assert all(matcher.accept(t) for t in tokens)
    row = rt.allocate_bitmask(1)
    matcher.fill(row, 0)
    return row[0].copy()


@pytest.mark.parametrize("name", sorted(SPECS))
def test_a_first_fill_is_the_engines_own_first_mask(rt, name):
    compiled = rt.compile(SPECS[name])
    assert compiled.first_mask is not None and not compiled.first_mask.flags.writeable
    expected = engine_first_mask(rt, compiled)
    assert np.array_equal(compiled.first_mask, expected)
    assert compiled.nbytes >= compiled.engine.nbytes(compiled.grammar) + expected.nbytes
    reqs = [rt.new_request(SPECS[name]).wait(60) for _ in range(3)]
    single = np.random.default_rng(1).integers(-2**31, 2**31, (2, rt.bitmask_words),
                                               dtype=np.int32)  # every word overwritten
    reqs[0].fill(single, 1)
    batch = rt.allocate_bitmask(4)
    batch[:] = 12345
    rt.fill_bitmask([reqs[1], None, reqs[2]], batch)
    for got in (single[1], batch[0], batch[2]):
        assert np.array_equal(got, expected)
    assert (batch[1] == -1).all() and (batch[3] == 12345).all()  # unconstrained; not a row


def test_the_first_token_a_mask_allows_starts_the_language(rt):
    """Against the language, not the engine: an object schema's first tokens open it."""
    info = rt.info
    req = rt.new_request(SPECS["object"]).wait(60)
    row = rt.allocate_bitmask(1)
    req.fill(row, 0)
    firsts = {info.decode([int(t)]).lstrip()[:1] for t in allowed(row[0], rt.vocab_size)}
    assert "{" in firsts and firsts <= {"{", ""}


@pytest.mark.parametrize("name", sorted(SPECS))
def test_rolled_back_to_the_start_the_first_mask_again(rt, name):
    compiled = rt.compile(SPECS[name])
    expected = engine_first_mask(rt, compiled)
    req = rt.new_request(SPECS[name]).wait(60)
    ids = rt.info.encode(TEXTS[name])
    assert req.accept_tokens(ids) == len(ids)
    row = rt.allocate_bitmask(1)
    req.fill(row, 0)
    assert not np.array_equal(row[0], expected)  # the end of the text: stop tokens
    req.rollback(len(ids) - 1)
    second = rt.allocate_bitmask(1)
    req.fill(second, 0)  # one token in: a second mask (computed with the compile)
    assert np.array_equal(second[0], engine_first_mask(rt, compiled, ids[:1]))
    req.rollback(1)
    req.fill(row, 0)
    assert np.array_equal(row[0], expected)


def test_the_first_two_fills_call_no_engine(rt, monkeypatch):
    compiled = rt.compile(SPECS["array"])
    matcher_type = type(compiled.engine.new_matcher(compiled.grammar))
    req = rt.new_request(SPECS["array"]).wait(60)
    calls = []
    real = matcher_type.fill
    monkeypatch.setattr(matcher_type, "fill", lambda self, bm, row: (calls.append(row),
                                                                      real(self, bm, row)))
    row = rt.allocate_bitmask(1)
    req.fill(row, 0)
    assert calls == []
    open_, quote = rt.info.encode("[")[0], rt.info.encode('"')[0]
    assert req.accept(open_)
    req.fill(row, 0)
    assert calls == []
    assert req.accept(quote)
    req.fill(row, 0)
    assert calls == [0]


@pytest.mark.parametrize("name", sorted(SPECS))
def test_second_masks_are_the_engines_own(rt, name):
    """For each token the first mask allows (when few), the mask after it; a request one
    token in, filled alone or in a batch, gets it."""
    compiled = rt.compile(SPECS[name])
    firsts = [int(t) for t in allowed(compiled.first_mask, rt.vocab_size)]
    seconds = compiled.second_masks
    if len(firsts) > SECOND_MASKS_MAX:
        assert seconds is None
        return
    assert seconds is not None and sorted(seconds) == firsts, (name, firsts)
    for token in firsts:
        expected = engine_first_mask(rt, compiled, [token])
        assert np.array_equal(seconds[token], expected) and not seconds[token].flags.writeable
        single, batch = rt.allocate_bitmask(1), rt.allocate_bitmask(2)
        reqs = [rt.new_request(SPECS[name]).wait(60) for _ in range(2)]
        assert all(r.accept(token) for r in reqs)
        reqs[0].fill(single, 0)
        rt.fill_bitmask([None, reqs[1]], batch)
        assert np.array_equal(single[0], expected) and np.array_equal(batch[1], expected)
    assert compiled.nbytes >= (compiled.engine.nbytes(compiled.grammar)
                               + (1 + len(firsts)) * compiled.first_mask.nbytes)


def test_a_first_mask_of_many_tokens_has_no_second_masks(rt):
    compiled = rt.compile(GrammarSpec.json_schema({"type": "integer"}))
    assert len(allowed(compiled.first_mask, rt.vocab_size)) > SECOND_MASKS_MAX
    assert compiled.second_masks is None


def test_after_the_reasoning_phase_the_first_grammar_mask(rt):
    info = rt.info
    end = tuple(info.encode("</think>"))
    spec = SPECS["object"]
    req = rt.new_request(spec, reasoning=ReasoningConfig(end)).wait(60)
    row = rt.allocate_bitmask(1)
    req.fill(row, 0)
    assert not np.array_equal(row[0], rt.compile(spec).first_mask)  # thinking: free text
    assert req.accept_tokens(info.encode("so") + list(end)) == len(info.encode("so")) + len(end)
    req.fill(row, 0)
    assert np.array_equal(row[0], engine_first_mask(rt, rt.compile(spec)))


@pytest.mark.parametrize("text", ["", "{"])
def test_a_request_near_the_start_moves_to_the_upgrade_and_its_copied_mask(deepseek, text):
    """Under ``auto`` the first compile is llguidance's; once xgrammar's upgrade landed, a
    request at the start or one token in is on the upgraded grammar and gets its mask
    computed with that compile."""
    spec = GrammarSpec.json_schema({"type": "object", "properties": {"n": {"type": "integer"}},
                                    "required": ["n"], "additionalProperties": False})
    with GrammarRuntime(deepseek, "auto", compile_timeout_s=20) as rt:
        first = rt.compile(spec)
        assert first.engine_name == "llguidance" and first.second_masks is not None
        req = rt.new_request(spec).wait(60)
        tokens = deepseek.encode(text) if text else []
        assert req.accept_tokens(tokens) == len(tokens) <= 1
        for _ in range(2000):
            if rt.upgrade_state(spec) != "running":
                break
            time.sleep(0.01)
        assert rt.upgrade_state(spec) == "done"
        upgraded = first.upgraded
        assert upgraded is not None and upgraded.engine_name == "xgrammar"
        assert upgraded.first_mask is not None and upgraded.second_masks is not None
        row = rt.allocate_bitmask(1)
        req.fill(row, 0)
        assert req.engine_name == "xgrammar"
        assert np.array_equal(row[0], engine_first_mask(rt, upgraded, tokens))
