"""The runtime's error contract: bad input to any public entry point raises a named exception
(naming the value) and changes nothing: not the request's state, not the bitmask passed in.

``apply_token_mask``'s half of the contract is tests/test_errors.py.
"""

from __future__ import annotations

import numpy as np
import pytest

from portable_guided.runtime import (
    GrammarSpec,
    GrammarSpecError,
    ReasoningConfig,
)

ENGINES = ["xgrammar", "llguidance"]
SCHEMA = {"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]}
PREFIX = '{"name": "ab'


def nested(depth: int) -> dict:
    schema: dict = {"type": "string"}
    for _ in range(depth):
        schema = {"type": "object", "properties": {"a": schema}}
    return schema


SPEC_CASES = [
    # (id, constructor call, exception, message)
    ("schema of int", lambda: GrammarSpec.json_schema(42), TypeError, "got int"),
    ("schema invalid JSON", lambda: GrammarSpec.json_schema("{"), GrammarSpecError, "not valid JSON"),
    ("schema 200 deep", lambda: GrammarSpec.json_schema(nested(100)), GrammarSpecError,
     "deeper than 128"),
    ("schema 200 deep as text", lambda: GrammarSpec.json_schema('{"a":' * 5000 + "1" + "}" * 5000),
     GrammarSpecError, "deeper than 128"),
    ("schema lone surrogate", lambda: GrammarSpec.json_schema({"enum": ["\ud800"]}),
     GrammarSpecError, "lone UTF-16 surrogate"),
    ("remote ref under a property named default", lambda: GrammarSpec.json_schema(
        {"type": "object", "properties": {"default": {"$ref": "file:///etc/passwd"}},
         "required": ["default"]}), GrammarSpecError, r"remote \$ref 'file:///etc/passwd'"),
    ("remote ref under a definition named enum", lambda: GrammarSpec.json_schema(
        {"$defs": {"enum": {"$ref": "http://example.com/s.json"}}}), GrammarSpecError,
     r"/\$defs/enum/\$ref"),
    ("remote dynamicRef", lambda: GrammarSpec.json_schema({"$dynamicRef": "http://x/s#a"}),
     GrammarSpecError, r"remote \$dynamicRef"),
    ("regex of int", lambda: GrammarSpec.regex(5), TypeError, "got int"),
    ("regex empty", lambda: GrammarSpec.regex(""), GrammarSpecError, "empty"),
    ("regex repeat overflow", lambda: GrammarSpec.regex("a{4294967295}"), GrammarSpecError,
     "a\\{4294967295\\}"),
    ("regex unbalanced", lambda: GrammarSpec.regex("(ab"), GrammarSpecError, "invalid regex"),
    ("ebnf of bytes", lambda: GrammarSpec.ebnf(b"root ::= 'a'"), TypeError, "got bytes"),
    ("ebnf without root", lambda: GrammarSpec.ebnf("x ::= 'a'"), GrammarSpecError, "root"),
    ("choice of str", lambda: GrammarSpec.choice("ab"), TypeError, "got str"),
    ("choice empty", lambda: GrammarSpec.choice([]), GrammarSpecError, "at least one"),
    ("choice of int", lambda: GrammarSpec.choice([1]), TypeError, r"\[1\]"),
    ("choice lone surrogate", lambda: GrammarSpec.choice(["\ud800"]), GrammarSpecError,
     "surrogate"),
    ("tag begin int", lambda: GrammarSpec.structural_tag(
        [{"begin": 1, "schema": {}, "end": "</f>"}], ["<f"]), TypeError, "begin must be a str"),
    ("tag end None", lambda: GrammarSpec.structural_tag(
        [{"begin": "<f>", "schema": {}, "end": None}], ["<f"]), TypeError, "end must be a str"),
    ("tags a dict", lambda: GrammarSpec.structural_tag(
        {"begin": "<f>", "schema": {}, "end": "</f>"}, ["<f"]), TypeError, "tags must be"),
    ("triggers a str", lambda: GrammarSpec.structural_tag(
        [{"begin": "<f>", "schema": {}, "end": "</f>"}], "<f"), TypeError, "triggers must be"),
    ("tag without end", lambda: GrammarSpec.structural_tag(
        [{"begin": "<f>", "schema": {}}], ["<f"]), GrammarSpecError, "lacks"),
    ("xgrammar tag of a list", lambda: GrammarSpec.xgrammar_structural_tag([]), TypeError,
     "got list"),
    ("xgrammar tag not JSON", lambda: GrammarSpec.xgrammar_structural_tag("{x"),
     GrammarSpecError, "not JSON"),
    ("xgrammar tag without format", lambda: GrammarSpec.xgrammar_structural_tag(
        {"type": "structural_tag", "structures": []}), GrammarSpecError,
     r"\['structures', 'type'\]"),
    ("xgrammar tag of another type", lambda: GrammarSpec.xgrammar_structural_tag(
        {"type": "json_schema", "format": {}}), GrammarSpecError, "'json_schema'"),
]


@pytest.mark.parametrize("case", SPEC_CASES, ids=[c[0] for c in SPEC_CASES])
def test_spec_constructors_raise_named_errors(case):
    _, call, error, text = case
    with pytest.raises(error, match=text):
        call()


V = 129_344  # the deepseek fixture's vocab_size
REQUEST_CASES = [
    # (id, call(rt, req, bitmask), exception, message); bitmask has 2 rows
    ("new_request of a dict", lambda rt, req, bm: rt.new_request(SCHEMA), TypeError,
     "GrammarSpec"),
    ("new_request bad policy", lambda rt, req, bm: rt.new_request(
        GrammarSpec.regex("a"), on_error="ignore"), ValueError, "'ignore'"),
    ("new_request bad reasoning", lambda rt, req, bm: rt.new_request(
        GrammarSpec.regex("a"), reasoning=[5]), TypeError, "ReasoningConfig"),
    ("new_request think end out of range", lambda rt, req, bm: rt.new_request(
        GrammarSpec.regex("a"), reasoning=ReasoningConfig((V,))), ValueError, str(V)),
    ("fill row past the end", lambda rt, req, bm: req.fill(bm, 2), ValueError, "row 2"),
    ("fill negative row", lambda rt, req, bm: req.fill(bm, -1), ValueError, "row -1"),
    ("fill bool row", lambda rt, req, bm: req.fill(bm, True), TypeError, "bool"),
    ("fill row of a view", lambda rt, req, bm: req.fill(bm[1:], 1), ValueError,
     "1 rows"),
    ("fill narrow bitmask", lambda rt, req, bm: req.fill(bm[:, :-1].copy(), 0), ValueError,
     "shape"),
    ("fill int64 bitmask", lambda rt, req, bm: req.fill(bm.astype(np.int64), 0), ValueError,
     "int64"),
    ("fill_bitmask bool rows", lambda rt, req, bm: rt.fill_bitmask([req], bm, rows=[True]),
     TypeError, "bool"),
    ("fill_bitmask row out of range", lambda rt, req, bm: rt.fill_bitmask([req], bm, rows=[2]),
     ValueError, r"\[2\]"),
    ("fill_bitmask huge row", lambda rt, req, bm: rt.fill_bitmask([req], bm, rows=[2**70]),
     ValueError, "out of range"),
    ("fill_bitmask duplicate rows", lambda rt, req, bm: rt.fill_bitmask(
        [req, None], bm, rows=[1, 1]), ValueError, "duplicates"),
    ("fill_bitmask too many requests", lambda rt, req, bm: rt.fill_bitmask(
        [req, None, None], bm), ValueError, "3 requests"),
    ("fill_bitmask not a request", lambda rt, req, bm: rt.fill_bitmask([req, "req"], bm),
     TypeError, "str"),
    ("accept vocab_size", lambda rt, req, bm: req.accept(V), ValueError, f"{V} out of range"),
    ("accept -1", lambda rt, req, bm: req.accept(-1), ValueError, "-1 out of range"),
    ("accept huge", lambda rt, req, bm: req.accept(2**70), ValueError, "out of range"),
    ("accept bool", lambda rt, req, bm: req.accept(True), TypeError, "bool"),
    ("accept str", lambda rt, req, bm: req.accept("5"), TypeError, "str"),
    ("accept float", lambda rt, req, bm: req.accept(5.0), TypeError, "float"),
    ("accept_tokens one bad", lambda rt, req, bm: req.accept_tokens([1, V]), ValueError,
     str(V)),
    ("accept_tokens of str", lambda rt, req, bm: req.accept_tokens("ab"), TypeError, "str"),
    ("rollback negative", lambda rt, req, bm: req.rollback(-1), ValueError, "-1"),
    ("rollback bool", lambda rt, req, bm: req.rollback(True), TypeError, "bool"),
    ("rollback float", lambda rt, req, bm: req.rollback(1.0), TypeError, "float"),
    ("rollback past the start", lambda rt, req, bm: req.rollback(10_000), ValueError,
     "only"),
    ("draft masks bad id", lambda rt, req, bm: req.fill_draft_masks([V], bm), ValueError,
     str(V)),
    ("draft masks too many", lambda rt, req, bm: req.fill_draft_masks([1, 2], bm), ValueError,
     "rows 0..2"),
    ("draft masks negative start", lambda rt, req, bm: req.fill_draft_masks([], bm, -1),
     ValueError, "row -1"),
    ("draft tree link out of range", lambda rt, req, bm: req.fill_draft_tree(
        [5, -1], [-1, -1], [1, 2], bm), ValueError, r"\[5\]"),
    ("draft tree loop", lambda rt, req, bm: req.fill_draft_tree(
        [1, 0], [-1, -1], [1, 2], bm), ValueError, "point back"),
]


@pytest.fixture(params=ENGINES)
def engine_rt(request, runtimes):
    return runtimes[request.param]


@pytest.mark.parametrize("case", REQUEST_CASES, ids=[c[0] for c in REQUEST_CASES])
def test_bad_input_raises_and_changes_nothing(engine_rt, deepseek, case):
    assert deepseek.vocab_size == V
    _, call, error, text = case
    rt = engine_rt
    req = rt.new_request(GrammarSpec.json_schema(SCHEMA)).wait(60)
    ids = deepseek.encode(PREFIX)
    assert req.accept_tokens(ids) == len(ids)

    def state() -> tuple:
        probe = rt.allocate_bitmask(1)
        req.fill(probe, 0)
        return req.num_accepted, req.failed, req.is_terminated, req.num_rejected, probe.tobytes()

    before = state()
    bm = np.random.default_rng(0).integers(-2**31, 2**31, (2, rt.bitmask_words),
                                           dtype=np.int64).astype(np.int32)
    bm_before = bm.copy()
    with pytest.raises(error, match=text):
        call(rt, req, bm)
    assert state() == before
    np.testing.assert_array_equal(bm, bm_before)
