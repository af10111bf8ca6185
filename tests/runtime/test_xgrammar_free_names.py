"""Open objects with the ways out of declared names shared (engines/xgrammar_free_names.py):
every token mask equals that of xgrammar's own grammar for the schema (the reference),
along valid instances and random walks, and the rewrite covers every state xgrammar writes."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest

from portable_guided.runtime import GrammarSpec, load_tokenizer_info
from portable_guided.runtime.engines import create_engine
from portable_guided.runtime.engines.xgrammar_free_names import (
    NAME_BLOCKS,
    merge_equal_tries,
    share_free_name_tails,
    way_out_pieces,
)
from portable_guided.runtime.engines.xgrammar_surrogates import exclude_surrogates

xgr = pytest.importorskip("xgrammar")

#: Open objects: names that are prefixes of one another, characters a class escapes (names
#: that JSON escapes xgrammar refuses), non-ASCII, the empty name, nesting, and an open
#: object under a $ref.
SCHEMAS = [
    {"type": "object", "properties": {"a": {"type": "integer"}, "ab": {"type": "string"},
                                      "abc": {"type": "boolean"}, "b": {"type": "null"}},
     "required": ["a"]},
    {"type": "object", "properties": {"a]b": {"type": "integer"}, "x-y": {"type": "integer"},
                                      "a b": {"type": "integer"}, "[": {"type": "integer"},
                                      "^c": {"type": "integer"}, "": {"type": "integer"}}},
    {"type": "object", "properties": {"名前": {"type": "string"}, "éte": {"type": "integer"},
                                      "name": {"type": "string"}}},
    {"type": "object", "properties": {
        "dimensions": {"type": "object", "properties": {"height": {"type": "integer"},
                                                        "width": {"type": "integer"}}},
        "shape": {"type": "string"}}, "required": ["shape", "dimensions"]},
    {"type": "object", "properties": {"items": {"type": "array", "items": {"$ref": "#/$defs/p"}}},
     "$defs": {"p": {"type": "object", "properties": {"id": {"type": "integer"},
                                                      "idx": {"type": "string"}}}}},
    # forks on letters of every block (a way out of several letters is split in pieces)
    {"type": "object", "properties": {n: {"type": "integer"} for n in (
        "user_id", "user_name", "userId", "user9", "User", "x1", "x2", "_meta", "9lives",
        "alpha", "beta", "gamma", "omega", "zeta")}},
    # open objects under definitions whose names xgrammar keeps in its rule names
    {"type": "object", "properties": {"date": {"$ref": "#/definitions/foo.Date"},
                                      "span": {"$ref": "#/definitions/time-span"}},
     "definitions": {"foo.Date": {"type": "object", "properties": {
         "day": {"type": "number"}, "month": {"type": "number"}, "year": {"type": "number"}}},
         "time-span": {"type": "object", "properties": {"from": {"type": "string"},
                                                       "to": {"type": "string"}}}}},
    # one open object in two anyOf branches, and one definition reached twice: equal tries
    {"type": "object", "properties": {
        "alpha": {"type": "string"}, "beta": {"$ref": "#/$defs/pt"},
        "gamma": {"$ref": "#/$defs/pt"}},
     "anyOf": [{"required": ["alpha"]}, {"required": ["beta"]}],
     "$defs": {"pt": {"type": "object", "properties": {"x": {"type": "number"},
                                                       "y": {"type": "number"}}}}},
]

#: One valid instance of each: declared names in xgrammar's order, then free ones.
INSTANCES = [
    {"a": 1, "ab": "x", "abc": True, "b": None, "abcd": [1, {"a": 2}], "": 0, "A": "z"},
    {"a]b": 1, "x-y": 2, "a b": 3, "[": 4, "^c": 5, "": 6, "a]": "free", "^": None},
    {"名前": "x", "éte": 1, "name": "n", "名": 3, "é": "e", "nam": False},
    {"dimensions": {"height": 1, "width": 2, "w": 3, "heigh": {}}, "shape": "circle", "sh": 1},
    {"items": [{"id": 1, "idx": "a", "i": 2, "idxx": 3}, {}], "item": 0},
    {"user_id": 1, "userId": 2, "User": 3, "x1": 4, "zeta": 5, "user": 6, "userX": 7, "x": 8,
     "_": 9, "Users": 10, "9": 11, "delta": 12},
    {"date": {"day": 1, "month": 2, "year": 3, "da": 4, "hour": 5},
     "span": {"from": "a", "to": "b", "t": 1}, "dat": 0},
    {"alpha": "a", "beta": {"x": 1, "y": 2, "z": 3}, "gamma": {"x": 0, "xy": 1}, "al": 1,
     "betas": True},
]


@pytest.fixture(scope="module")
def engine():
    return create_engine("xgrammar", load_tokenizer_info("smollm2"))


def reference(engine, schema, any_whitespace):
    """xgrammar's own grammar for the schema, as the engine compiled it before the rewrite."""
    text, _ = engine.prepare(GrammarSpec.json_schema(schema, any_whitespace=any_whitespace))
    grammar = xgr.Grammar.from_json_schema(text, any_whitespace=any_whitespace,
                                           strict_mode=False)
    return engine._compiler.compile_grammar(xgr.Grammar.from_ebnf(
        exclude_surrogates(str(grammar))))


def masks_agree(ours, theirs, tokens, rng, random_steps):
    """Walk ``tokens`` then ``random_steps`` tokens drawn from the allowed ones, comparing
    the two grammars' masks at every step; the number of steps compared."""
    a, b = xgr.GrammarMatcher(ours), xgr.GrammarMatcher(theirs)
    vocab = ours.tokenizer_info.vocab_size
    mask_a = xgr.allocate_token_bitmask(1, vocab)
    mask_b = mask_a.clone()
    steps = 0
    todo = list(tokens)
    while not a.is_terminated():
        a.fill_next_token_bitmask(mask_a)
        b.fill_next_token_bitmask(mask_b)
        assert np.array_equal(mask_a.numpy(), mask_b.numpy()), f"masks differ at step {steps}"
        steps += 1
        if todo:
            token = todo.pop(0)
        elif random_steps > 0:
            random_steps -= 1
            bits = np.unpackbits(mask_a.numpy().view(np.uint8), bitorder="little")
            token = int(rng.choice(np.flatnonzero(bits[:vocab])))
        else:
            break
        assert a.accept_token(token) and b.accept_token(token), f"token {token} refused"
    return steps


@pytest.mark.parametrize("any_whitespace", [True, False], ids=["any-ws", "compact"])
@pytest.mark.parametrize("case", range(len(SCHEMAS)))
def test_masks_equal_xgrammars_own_grammar(engine, case, any_whitespace):
    schema, instance = SCHEMAS[case], INSTANCES[case]
    ours = engine.compile(GrammarSpec.json_schema(schema, any_whitespace=any_whitespace))
    theirs = reference(engine, schema, any_whitespace)
    info = load_tokenizer_info("smollm2")
    text = json.dumps(instance, ensure_ascii=False)  # xgrammar's compact layout too
    rng = np.random.default_rng(case)
    steps = masks_agree(ours, theirs, info.encode(text), rng, random_steps=0)
    assert steps > len(text) // 8  # the instance was walked, not refused at once
    for _ in range(4):  # random walks: free names, declared names, values
        masks_agree(ours, theirs, [], rng, random_steps=40)


# A way out of a declared name as xgrammar writes it, and a state of a free name's trie.
WAY_OUT = re.compile(r'\(\[\^\\0-\\x1f\\"\\\\\\r\\n(?:\\.|[^\]\\])*\] basic_string_sub\)')


@pytest.mark.parametrize("case", range(len(SCHEMAS)))
def test_every_state_of_xgrammars_trie_is_rewritten(engine, case):
    """Fails if xgrammar writes its free names another way (the speed-up would be lost)."""
    text, _ = engine.prepare(GrammarSpec.json_schema(SCHEMAS[case]))
    before = str(xgr.Grammar.from_json_schema(text, any_whitespace=True, strict_mode=False))
    after = share_free_name_tails(before)
    states = [line for line in before.splitlines()
              if re.match(r"\S+_addl_key_\d+ ::= ", line) and WAY_OUT.search(line)]
    assert states, "xgrammar wrote no free-name trie for an open object"
    rewritten = {line.partition(" ::= ")[0]: line for line in after.splitlines()}
    for line in states:
        name = line.partition(" ::= ")[0]
        if name in rewritten:
            assert not WAY_OUT.search(rewritten[name]), line
        else:  # a trie merged into an equal one: no use of it is left
            assert not re.search(rf"(?<![\w.-]){re.escape(name)}(?![\w.-])", after), name
    shared = [line for line in after.splitlines() if re.match(r"pg_free_name_\d+ ::= ", line)]
    ways_out = {m.group(0) for line in states for m in WAY_OUT.finditer(line)}
    assert len(shared) == len(ways_out) < len(states) + 1
    lookahead = r"(=([ \n\r\t]* [,}\]:]))"
    pieces = {line.partition(" ::= ")[0]: line for line in after.splitlines()
              if line.startswith("pg_free_name_") and line not in shared}
    for line in shared:  # the way out itself, or a union of pieces that hold the lookahead
        union = re.fullmatch(r"\S+ ::= \((\w+(?: \| \w+)*)\)", line)
        if union is None:
            assert line.endswith(lookahead), line
        else:
            assert all(pieces[name].endswith(lookahead) for name in union.group(1).split(" | "))


def test_equal_tries_are_compiled_once(engine):
    """The anyOf's two branches hold one open object, so one trie (the other's uses point
    at it); tries of other text stay apart."""
    schema = {"type": "object", "properties": {"alpha": {"type": "string"},
                                               "beta": {"type": "integer"}},
              "anyOf": [{"required": ["alpha"]}, {"required": ["beta"]}]}
    text, _ = engine.prepare(GrammarSpec.json_schema(schema))
    before = str(xgr.Grammar.from_json_schema(text, any_whitespace=True, strict_mode=False))
    after = share_free_name_tails(before)

    def tries(ebnf):
        return {m.group(1) for m in re.finditer(r"^(\S+_addl_key) ::= ", ebnf, re.MULTILINE)}

    assert len(tries(before)) == 2 and len(tries(after)) == 1
    (kept,) = tries(after)
    assert after.count(f" {kept} ") == 2  # used by both branches' properties
    states = [line for line in after.splitlines() if line.startswith(f"{kept}_")]
    assert len(states) == sum(line.startswith(f"{kept}_") for line in before.splitlines())
    text, _ = engine.prepare(GrammarSpec.json_schema(SCHEMAS[-1]))  # (the masks' case)
    before = str(xgr.Grammar.from_json_schema(text, any_whitespace=True, strict_mode=False))
    assert len(tries(share_free_name_tails(before))) < len(tries(before))
    differ = ('a_addl_key ::= ((a_addl_key_1))\na_addl_key_1 ::= (("x"))\n'
              'b_addl_key ::= ((b_addl_key_1))\nb_addl_key_1 ::= (("y"))\n')
    assert merge_equal_tries(differ) == differ


def test_a_way_out_of_several_letters_is_split_in_shared_pieces(engine):
    """Schemas with other names share their pieces (the text does not depend on them)."""
    def text(names):
        schema = {"type": "object", "properties": {n: {"type": "string"} for n in names}}
        return engine.prepared_ebnf(engine.prepare(GrammarSpec.json_schema(schema)))

    def pieces(ebnf):
        return {line for line in ebnf.splitlines()
                if re.match(r"pg_free_name_(rest|b\d)", line)}

    one, other = text(["base", "width"]), text(["bolt", "wax", "zed"])
    assert pieces(one) and pieces(one) & pieces(other)
    assert r"[^\0-\x1f\"\\\r\nbw]" not in one  # no rule of the schema's own letters
    dollar = text(["base", "$ref"])  # a character outside the blocks: one rule, as it was
    assert not pieces(dollar)
    assert re.search(r'pg_free_name_\d+ ::= \(\(\[\^\\0-\\x1f\\"\\\\\\r\\n(b\$|\$b)\]', dollar)
    assert not pieces(text(["base"]))  # one letter left out: its rule is shared as it is


def test_the_pieces_of_a_way_out_cover_the_class_less_its_letters():
    blocks = "".join(NAME_BLOCKS)
    assert way_out_pieces("a") is None and way_out_pieces("a$") is None
    assert way_out_pieces(r"a\-") is None
    for excluded in ("ab", "aZ_", "zy9", "az"):
        parts = way_out_pieces(excluded)
        assert parts[0] == ("rest", None)
        kept = "".join(k for _, k in parts[1:])
        assert sorted(kept) == sorted(c for c in blocks if c not in excluded)


def test_text_without_a_trie_is_unchanged():
    text = ('basic_string_sub ::= (("\\"") | ([^\\0-\\x1f\\"\\\\\\r\\n] basic_string_sub) | '
            '("\\\\" basic_escape basic_string_sub))\nroot ::= (("{" "}"))\n')
    assert share_free_name_tails(text) == text


def test_a_rule_name_taken_is_not_reused():
    text = ('root_addl_key ::= (("\\"" root_addl_key_1))\n'
            'root_addl_key_1 ::= (([^\\0-\\x1f\\"\\\\\\r\\n] basic_string_sub) | '
            '("\\\\" basic_escape basic_string_sub))\npg_free_name_0 ::= (("x"))')
    out = share_free_name_tails(text)
    assert "root_addl_key_1 ::= (pg_pg_free_name_0)" in out
    assert "pg_free_name_0 ::= ((\"x\"))" in out


def test_a_tool_calls_open_object_masks_equal_xgrammars_own(engine, monkeypatch):
    from portable_guided.runtime.engines import xgrammar as module

    spec = GrammarSpec.structural_tag(
        [{"begin": "<function=f>", "schema": SCHEMAS[3], "end": "</function>"}], ["<function="])
    ours = engine.compile(spec)
    monkeypatch.setattr(module, "share_free_name_tails", lambda text: text)
    engine._compiler.clear_cache()
    theirs = engine.compile(spec)
    assert "pg_free_name_0 ::=" in str(ours.grammar)
    assert "pg_free_name_0 ::=" not in str(theirs.grammar)
    text = "Calling: <function=f>" + json.dumps(INSTANCES[3]) + "</function>"
    rng = np.random.default_rng(7)
    assert masks_agree(ours, theirs, load_tokenizer_info("smollm2").encode(text), rng,
                       random_steps=40) > 20
