"""xgrammar reads a schema's ``pattern`` as the regex says once ``xgrammar_patterns`` has
rewritten it; the reference is Python's ``re`` on every short string over a small alphabet."""

from __future__ import annotations

import itertools
import json
import random
import re

import pytest

from portable_guided.json_schema.xgrammar_forms import (
    pattern_with_lengths,
    search_pattern,
    whole_match_pattern,
)
from portable_guided.json_schema.xgrammar_patterns import decides_match, patterns_disjoint
from portable_guided.runtime.json_semantics import xgrammar_exact_strings as exact_schema_patterns
from portable_guided.runtime.xgrammar_patterns import exact_pattern, needs_escaped_character

xgr = pytest.importorskip("xgrammar")

ALPHABET = "ab:1"
STRINGS = ["".join(p) for n in range(5) for p in itertools.product(ALPHABET, repeat=n)]
ATOMS = ["a", "b", ":", ".", "[ab]", "[^a]", "[^:\\s]", "\\d", "[a-b]", "\\w", "[^\\s]"]
QUANTIFIERS = ["", "", "", "?", "*", "+", "{0,1}", "{1,2}", "{2}", "{0,}", "{1,}", "{2,}"]


def _random_regex(rng: random.Random, depth: int = 0) -> str:
    """A sequence of 1-3 quantified atoms or groups (groups nest twice, may alternate)."""
    items = []
    for _ in range(rng.randint(1, 3)):
        if depth < 2 and rng.random() < 0.35:
            body = "|".join(_random_regex(rng, depth + 1)
                            for _ in range(rng.choice([1, 1, 1, 2])))
            atom = rng.choice(["(", "(?:"]) + body + ")"
        else:
            atom = rng.choice(ATOMS)
        items.append(atom + rng.choice(QUANTIFIERS))
    return "".join(items)


def _xgrammar_accepts(pattern: str) -> set[str]:
    """The strings of STRINGS that xgrammar's JSON-schema path accepts for ``pattern``."""
    schema = {"type": "string", "pattern": f"^{pattern}$"}
    grammar = xgr.Grammar.from_json_schema(json.dumps(schema), any_whitespace=False)
    compiled = xgr.GrammarCompiler(xgr.TokenizerInfo([]), cache_enabled=False).compile_grammar(
        grammar)
    matcher = xgr.GrammarMatcher(compiled, terminate_without_stop_token=True)
    accepted = set()
    for s in STRINGS:
        matcher.reset()
        if matcher.accept_string(json.dumps(s)) and matcher.is_terminated():
            accepted.add(s)
    return accepted


def _xgrammar_accepts_schema(schema: dict) -> set[str]:
    """The strings of STRINGS xgrammar accepts for the string ``schema`` once our rewrites
    (``xgrammar_exact_strings``) have run."""
    out, bad = exact_schema_patterns(schema)
    assert not bad, bad
    assert not {"minLength", "maxLength"} & out.keys(), out  # (folded into the pattern)
    return _xgrammar_accepts(out["pattern"][1:-1])


#: A character written without an escape (what an unanchored side stands for).
ANY = '[^\\x00-\\x1f"\\\\]'


def _regex_accepts(pattern: str) -> set[str]:
    return {s for s in STRINGS if re.fullmatch(pattern, s)}


def test_rewritten_patterns_match_as_python_re_does():
    rng = random.Random(20261125)
    wrong_before = 0
    for _ in range(600):
        pattern = _random_regex(rng)
        exact = exact_pattern(pattern)
        assert exact is not None, pattern
        want = _regex_accepts(pattern)
        assert _xgrammar_accepts(exact) == want, (pattern, exact)
        if exact != pattern:
            wrong_before += _xgrammar_accepts(pattern) != want
    # The sample holds patterns that xgrammar reads wrongly without the rewrite (about 2%),
    # so the assertion above is tested on the cases that matter.
    assert wrong_before >= 3, wrong_before


def test_the_xgrammar_bugs_are_real():
    # If these fail, xgrammar fixed its automata: the rewrite may go (keep it for older
    # versions), see portable_guided/json_schema/xgrammar_patterns.py.
    assert "ab" in _xgrammar_accepts("a(:b+)?")  # `(X)?`: X entered past its start
    assert "ab" not in _regex_accepts("a(:b+)?")
    # Github_medium o22092 in MaskBench (an invalid instance xgrammar accepted):
    maskbench = "[^:\\s]+:[^:\\s]+(:[^\\s]+)?"
    assert re.fullmatch(maskbench, "ab:ab:") is None
    assert exact_pattern(maskbench) == "[^:\\s]+:[^:\\s]+(:[^\\s]+){0,1}"


@pytest.mark.parametrize("pattern, exact", [
    ("^a(:b+)?$", "^a(:b+){0,1}$"),
    ("(a|bc*)??", "(a|bc*){0,1}?"),
    ("(ab){2,}", "(ab){2}(ab)*"),
    ("(ab){1,}x", "(ab)+x"),
    ("(?:ab){0,}", "(?:ab)*"),
    ("((a)?b)?", "((a){0,1}b){0,1}"),
    ("(ab){1,3}(c)*(d)+", "(ab){1,3}(c)*(d)+"),
    ("a?b*\\(c\\)?[)?]?", "a?b*\\(c\\)?[)?]?"),
    ("[^\\]](x)?", "[^\\]](x){0,1}"),
])
def test_exact_pattern_rewrites(pattern, exact):
    assert exact_pattern(pattern) == exact
    assert _regex_accepts(pattern) == _regex_accepts(exact)


@pytest.mark.parametrize("pattern", ["(a", "a)", "[]a]", "[^]a]", "a\\", "[ab"])
def test_patterns_that_cannot_be_scanned(pattern):
    assert exact_pattern(pattern) is None


def test_schema_patterns_rewritten_where_they_are_patterns():
    schema = {
        "type": "object",
        "properties": {"pattern": {"type": "string", "pattern": "^(ab)?$"},
                       "enum": {"enum": [{"pattern": "(x)?"}]}},
        "patternProperties": {"^(k)?$": {"type": "integer"}, "^z$": {}},
        "items": [{"pattern": "(c)?"}],
        "default": {"pattern": "(d)?"},
    }
    out, bad = exact_schema_patterns(schema)
    assert bad == []
    assert out["properties"]["pattern"]["pattern"] == "^(ab){0,1}$"
    assert out["properties"]["enum"] == {"enum": [{"pattern": "(x)?"}]}  # data, not a schema
    assert list(out["patternProperties"]) == ["^(k){0,1}$", "^z$"]
    # (unanchored: JSON Schema searches, so any characters may stand around the match)
    assert out["items"] == [{"pattern": f"^{ANY}*((c){{0,1}}){ANY}*$"}]
    assert out["default"] == {"pattern": "(d)?"}
    assert schema["properties"]["pattern"]["pattern"] == "^(ab)?$"  # input untouched
    same = {"type": "string", "pattern": "^a+$"}
    assert exact_schema_patterns(same)[0] is same


def test_schema_patterns_that_cannot_be_scanned_are_reported():
    _, bad = exact_schema_patterns({"patternProperties": {"(a)?": {}, "(a){0,1}": {}},
                                    "pattern": "(b"})
    assert sorted(bad) == ["(a){0,1}", "(b"]


@pytest.mark.parametrize("pattern, needs", [
    ("^\\\\d+$", True), ('^a"b$', True), ('^a\\"b$', True), ("^a(\\\\)?$", True),
    ("^[\\\\a]+$", False), ('^[^"]+$', False), ("^\\d+\\.\\w$", False), ("^a$", False),
])
def test_patterns_needing_an_escaped_character(pattern, needs):
    assert needs_escaped_character(pattern) is needs


def test_xgrammar_writes_no_string_that_needs_an_escape():
    """Why the patterns above are refused: a valid string holding a backslash is rejected."""
    schema = {"type": "string", "pattern": "^\\\\d+$"}
    assert re.search(schema["pattern"], "\\dd")
    grammar = xgr.Grammar.from_json_schema(json.dumps(schema), any_whitespace=False)
    compiled = xgr.GrammarCompiler(xgr.TokenizerInfo([]), cache_enabled=False).compile_grammar(
        grammar)
    matcher = xgr.GrammarMatcher(compiled, terminate_without_stop_token=True)
    assert not (matcher.accept_string(json.dumps("\\dd")) and matcher.is_terminated())


def test_the_upstream_reproducers_still_reproduce():
    # scripts/xgrammar_upstream_repro.py (docs/upstream.md): each case is a difference from
    # JSON Schema on xgrammar 0.2.8 itself. When an upgrade fixes one, this fails: drop the
    # workaround (and the case) then.
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "scripts" / "xgrammar_upstream_repro.py"
    spec = importlib.util.spec_from_file_location("xgrammar_upstream_repro", path)
    repro = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(repro)
    compiler = xgr.GrammarCompiler(repro.byte_tokenizer(), max_threads=1, cache_enabled=False)
    fixed = [title for title, schema, text, expected in repro.CASES
             if repro.accepts(compiler, schema, text) == expected]
    assert fixed == []


def test_unanchored_patterns_search_as_python_re_does():
    """JSON Schema's pattern matches anywhere in the string (ECMA-262 ``search``); xgrammar
    matches the whole string, so the rewrite puts any characters on an unanchored side."""
    rng = random.Random(20261127)
    for _ in range(300):
        body = _random_regex(rng)
        start, end = rng.choice(["", "^"]), rng.choice(["", "$"])
        pattern = f"{start}{body}{end}"
        want = {s for s in STRINGS if re.search(pattern, s)}
        assert _xgrammar_accepts_schema({"type": "string", "pattern": pattern}) == want, pattern


def test_a_top_level_alternation_is_searched_branch_by_branch():
    # `^a|b` is "starts with a, or holds b": each branch searched on its own, exactly.
    pattern = "^a|b"
    want = {s for s in STRINGS if re.search(pattern, s)}
    assert _xgrammar_accepts_schema({"type": "string", "pattern": pattern}) == want
    assert search_pattern("^a$") == "^a$"
    # `a\\$`: a backslash, then the anchor; `a\$`: a literal dollar, unanchored.
    assert search_pattern("a\\\\$") == f"^{ANY}*(a\\\\)$"
    assert search_pattern("a\\$") == f"^{ANY}*(a\\$){ANY}*$"
    # Anchors of a group spanning a branch, or the whole pattern (Github_medium o1529,
    # o14405): the branch's own.
    assert search_pattern("(^a+$)") == "^(a+)$"
    assert search_pattern("(^a|b)") == f"^((a){ANY}*|{ANY}*(b){ANY}*)$"


def test_alternations_with_anchors_in_groups_search_as_python_re_does():
    """Branches anchored or not, some as a group holding their anchors (``(^ab$)``), the
    whole sometimes in one more group: xgrammar (after the rewrite) accepts exactly the
    strings Python's ``re.search`` finds a match in."""
    rng = random.Random(20261128)
    for _ in range(200):
        branches = []
        for _ in range(rng.randint(1, 3)):
            body = _random_regex(rng, depth=1)
            start, end = rng.choice(["", "^"]), rng.choice(["", "$"])
            branch = f"{start}{body}{end}"
            branches.append(f"{rng.choice(['(', '(?:'])}{branch})" if rng.random() < 0.5
                            else branch)
        pattern = "|".join(branches)
        if rng.random() < 0.3:
            pattern = f"({pattern})"
        want = {s for s in STRINGS if re.search(pattern, s)}
        assert _xgrammar_accepts_schema({"type": "string", "pattern": pattern}) == want, pattern


ONE_CLASS = ["^[a-b]", "^\\d", "^.", "^[^a]", "^\\w", "^[ab:]"]
REPEATS = ["", "*", "+", "?", "{2}", "{1,3}", "{0,}", "{2,}"]


def test_one_class_patterns_take_their_length_bounds():
    """xgrammar drops minLength/maxLength beside a pattern; for one class and a repeat the
    bounds go into the repeat, and the strings accepted are those of the pattern with a
    length within them."""
    rng = random.Random(7)
    for _ in range(200):
        pattern = rng.choice(ONE_CLASS) + rng.choice(REPEATS) + "$"
        low = rng.choice([0, 0, 1, 2, 3])
        high = rng.choice([None, 1, 2, 3, 4])
        schema = {"type": "string", "pattern": pattern, "minLength": low,
                  **({} if high is None else {"maxLength": high})}
        want = {s for s in STRINGS if re.search(pattern, s) and low <= len(s) and (
            high is None or len(s) <= high)}
        if pattern_with_lengths(pattern, low, high) is None:
            assert not want or high is not None and high < low, schema
            continue
        assert _xgrammar_accepts_schema(schema) == want, schema
    assert pattern_with_lengths("^[a-z]+$", 0, 64) == "^[a-z]{1,64}$"
    assert pattern_with_lengths("^[a-z]+x$", 0, 3) is None  # not one class: refused
    assert pattern_with_lengths("^\\w+$", 0, 500) is None  # above xgrammar's JSON repeats


def _random_name_pattern(rng: random.Random) -> str:
    atoms = ["a", "b", "_", r"\.", "a", "b", "[ab]", ".", "(ab)", "(a_)?", "(?:b)", "(a|b_)",
             "(?:_|ab)", "(b|(a|_))"]
    body = "".join(a + ("" if a.endswith("?") else rng.choice(["", "", "", "*", "+", "?", "{2}"]))
                   for a in (rng.choice(atoms) for _ in range(rng.randint(1, 4))))
    return rng.choice(["^", "^", ""]) + body + rng.choice(["$", "$", ""])


def test_patterns_disjoint_only_where_no_name_matches_both():
    """Against every name of up to 5 characters over ``a``, ``b``, ``_``, ``.`` (Python's
    ``re.search``, as JSON Schema searches): a pair called disjoint shares no name, and the
    fixed starts and ends it reads do tell most prefix-distinct pairs apart."""
    rng = random.Random(7)
    names = ["".join(p) for n in range(6) for p in itertools.product("ab_.", repeat=n)]
    told = 0
    for _ in range(400):
        first, second = _random_name_pattern(rng), _random_name_pattern(rng)
        if patterns_disjoint(first, second):
            told += 1
            shared = [s for s in names if re.search(first, s) and re.search(second, s)]
            assert not shared, (first, second, shared[:3])
    assert told > 15, told  # (the check is not vacuous)
    assert patterns_disjoint("^S_", "^I_") and patterns_disjoint("_id$", "_at$")
    assert patterns_disjoint("^BIOS$", "^BIO$")
    assert not patterns_disjoint("^a.*$", "^.*b$") and not patterns_disjoint("^(a|b)", "^c")
    assert not patterns_disjoint("^(ab)?c$", "^c$")
    # The fixed text before a group of alternatives holds (MaskBench-like Github_hard o12334).
    assert patterns_disjoint("^name:(en|nl|pt)$", "^displayName:(en|nl|pt)$")
    assert not patterns_disjoint("^a(b|c)$", "^a(c|d)$") and not patterns_disjoint("a|b", "^c")


@pytest.mark.parametrize(("pattern", "name", "expected"), [
    ("^name:(en|nl|pt)$", "name:en", True),
    ("^name:(en|nl|pt)$", "name:de", False),
    ("^x-", "x-rate", True),
    (r"\d{2}$", "ab12", True),
    (r"^[a-z]+(?=_)", "ab_c", True),
    # Read otherwise by one of them: not decided here.
    (r"\Aab", "ab", None),  # Python: an anchor; ECMA-262: the letter A
    (r"\p{L}", "a", None),  # ECMA-262 (u flag): a letter; Python: an error
    ("(?i)ab", "AB", None),  # an inline flag ECMA-262 does not have
    (r"(?<=a)b", "ab", None),
    ("[[a]b", "ab", None),  # a nested set some day, for Python
    (r"^\w+$", "é", None),  # \w: Unicode letters for Python, ASCII for ECMA-262
    ("^a$", "a\n", None),  # $: before a final newline for Python
])
def test_decides_match_only_where_python_and_ecma_read_alike(pattern, name, expected):
    assert decides_match(pattern, name) is expected


def test_a_pattern_of_one_width_with_that_maxlength_is_a_whole_string_match():
    """A string at most k characters long that holds a match of exactly k characters is
    that match (Github_ultra o13020: ``[a-zA-Z]{3}`` with minLength and maxLength 3): the
    search becomes a whole-string match, and xgrammar accepts exactly the strings of the
    pattern within the bounds. Random unanchored patterns of the atoms above."""
    rng = random.Random(11)
    folded = 0
    for _ in range(1200):
        pattern = _random_regex(rng)
        try:
            widths = re.compile(pattern)
        except re.error:
            continue
        high = rng.choice([1, 2, 3, 4])
        low = rng.choice([0, 1, high])
        if whole_match_pattern(pattern, low, high) is None:
            continue
        folded += 1
        schema = {"type": "string", "pattern": pattern, "minLength": low, "maxLength": high}
        want = {s for s in STRINGS if widths.search(s) and low <= len(s) <= high}
        assert _xgrammar_accepts_schema(schema) == want, schema
    assert folded > 20, folded
    assert whole_match_pattern("[a-zA-Z]{3}", 3, 3) == "^(?:[a-zA-Z]{3})$"
    assert whole_match_pattern("[a-zA-Z]{3}", 0, 4) is None  # "1abc" holds a match too
    assert whole_match_pattern("a|bc", 2, 2) is None  # two widths
    assert whole_match_pattern("a(?=b)", 1, 1) is None  # a lookahead: not measured
