"""Standard formats as our own languages (``portable_guided/json_schema/formats.py``).

Against a strict reference, ``jsonschema``'s format checker with its optional packages
(``rfc3339-validator``, ``fqdn``, ``idna``, ``rfc3987``, ``isoduration``, ``uri-template``,
``jsonpointer``; the ``test`` extra installs them):

- every string a format's regex accepts is a valid value of the format (soundness of our
  language; hypothesis ``from_regex``);
- no engine accepts an invalid instance of the JSON Schema Test Suite's
  ``optional/format`` files (drafts 4 to 2020-12) or a value the engines' own format code
  once let through (leap seconds anywhere, February 31, 64-character labels, bad punycode);
- how many of the suite's valid instances each engine still accepts (the subsets' coverage)
  is printed and held above a floor.

Also: one-edit near misses of valid values are accepted by an engine only where the regex
(read by Python) accepts them, so the engines read our regexes as written. About 45 s on two
busy cores (xgrammar compiles the bounded hostname and email labels in 1.5-3 s each).
"""

from __future__ import annotations

import importlib.util
import json
import re
from pathlib import Path

import pytest

from portable_guided.json_schema.formats import ENGINES, FORMATS, format_table_markdown
from portable_guided.runtime.json_lowering import STANDARD_FORMATS, lower
from portable_guided.runtime.xgrammar_patterns import (
    LARGEST_JSON_REPEAT,
    exact_pattern,
    largest_repeat,
    needs_escaped_character,
)

ROOT = Path(__file__).resolve().parents[2]
SUITES = ROOT / "tests" / "data" / "json-schema-test-suite"
#: The checker's optional packages: without one, it passes every value of that format.
STRICT_PACKAGES = ("rfc3339_validator", "fqdn", "idna", "rfc3987", "isoduration",
                   "uri_template", "jsonpointer")
_MISSING = [m for m in STRICT_PACKAGES if importlib.util.find_spec(m) is None]
strict = pytest.mark.skipif(bool(_MISSING), reason=f"the strict format checker needs {_MISSING} "
                            "(the `test` extra)")


def _checker():
    import jsonschema

    return jsonschema.Draft202012Validator.FORMAT_CHECKER


# -- the table ---------------------------------------------------------------------------------
def test_every_standard_format_has_one_entry():
    assert set(FORMATS) == set(STANDARD_FORMATS) and len(FORMATS) == 19
    for f in FORMATS.values():
        assert f.exact == (not f.left_out), f.name
        assert set(f.refused) <= set(ENGINES), f.name


@pytest.mark.parametrize("name", sorted(FORMATS))
def test_pattern_is_in_the_dialect_both_engines_read(name):
    p = FORMATS[name].pattern
    if p is None:
        return
    re.compile(p)
    assert p.startswith("^") and p.endswith("$") and not p.endswith("\\$"), name
    # No lookaround, non-capturing or named group, no \d (Unicode digits in some dialects).
    assert "(?" not in p and "\\d" not in p and "\\w" not in p and "\\s" not in p, name
    assert largest_repeat(p) <= LARGEST_JSON_REPEAT, name
    assert exact_pattern(p) is not None and not needs_escaped_character(p), name


def test_docs_carry_the_rendered_table():
    table = format_table_markdown()
    assert all(f"| `{name}` |" in table for name in FORMATS)
    # (indented there, as part of a list item)
    doc = [line.strip() for line in (ROOT / "docs" / "json_schema.md").read_text(
        encoding="utf-8").splitlines()]
    rows = table.splitlines()
    start = doc.index(rows[0])
    assert doc[start:start + len(rows)] == rows


# -- (a) soundness of each language against the strict checker ---------------------------------
@strict
@pytest.mark.parametrize("name", sorted(n for n, f in FORMATS.items() if f.pattern))
def test_every_string_of_the_language_is_a_valid_value(name):
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st

    checker = _checker()
    pattern = FORMATS[name].pattern

    @settings(max_examples=60, deadline=None, database=None,
              suppress_health_check=list(HealthCheck))
    @given(st.from_regex(pattern, fullmatch=True))
    def check(value):
        assert checker.conforms(value, name), (name, value)

    check()


# The longest names of each shape (hypothesis seldom writes them) and other edges.
EDGES = {
    "hostname": [".".join(["a" * 24] * 6), "a-" + "b" * 22, "ab-c.d1", "1.2.3.4", "a-b--c"],
    "idn-hostname": [".".join(["a" * 24] * 6), "ab-c"],
    "email": [".".join(["x" * 24] + ["y" * 12] * 3) + "@" + ".".join(["a" * 24] * 4), "a@b",
              "first.last+tag@mail.example.com", "m4.van.dijk@vu.nl"],
    "date-time": ["2000-02-29T23:59:59.999999999-23:59", "0001-01-01t00:00:00z"],
    "date": ["2400-02-29", "9999-12-31", "0001-01-01"],
    "ipv6": ["1:2:3:4:5:6:7::", "::1:2:3:4:5:6:7", "1:2:3:4:5:6:1.2.3.4", "::", "::1.2.3.4"],
    "uri-template": ["{+a.b,c:999,d*}x{?e}"],
    "relative-json-pointer": ["0#", "10/a~0b~1"],
}


@strict
@pytest.mark.parametrize("name", sorted(EDGES))
def test_edges_of_the_language_are_valid_values(name):
    checker = _checker()
    for value in EDGES[name]:
        assert re.fullmatch(FORMATS[name].pattern, value), (name, value)
        assert checker.conforms(value, name), (name, value)
    for value in BAD.get(name, ()):
        assert not re.fullmatch(FORMATS[name].pattern, value), (name, value)


# Values the engines' own format code accepted (xgrammar 0.2.8, llguidance 1.9.1), and
# random generation through the mask of real schemas ("0955-05-03T18:40:60+00:27").
BAD = {
    "date-time": ["1998-12-31T23:58:60Z", "1990-02-31T15:59:59.123-08:00",
                  "0955-05-03T18:40:60+00:27", "2023-02-29T00:00:00Z", "0000-01-01T00:00:00Z"],
    "time": ["22:59:60Z", "23:59:60Z", "12:00:00"],
    "date": ["2023-02-29", "1900-02-29", "2022-02-30", "0000-01-01"],
    "hostname": ["a" * 64 + ".com", ".".join(["a" * 63] * 4), "xn--X", "xn--hello-txk",
                 "-a.com", "a..b", "ab--c.com"],
    "idn-hostname": ["a" * 64, "xn--X", "xn--hello-txk"],
    "email": ["a@" + "b" * 64 + ".com", "@example.com", "a@-b.com"],
    "ipv6": ["::ffff:192.168.0.01", "1:2:3:4:5:6:7:8:9", "1::2::3"],
    "ipv4": ["192.168.0.01", "256.1.1.1"],
}


#: Values the RFCs forbid that the checker lets through (``fqdn`` reads no punycode, the
#: email check looks for an ``@``).
CHECKER_BLIND = {("hostname", "xn--X"), ("hostname", "xn--hello-txk"), ("email", "a@-b.com"),
                 ("email", "@example.com"), ("hostname", "ab--c.com"),
                 ("email", "a@" + "b" * 64 + ".com")}


@strict
def test_listed_bad_values_are_invalid():
    checker = _checker()
    for name, values in BAD.items():
        for v in values:
            assert checker.conforms(v, name) == ((name, v) in CHECKER_BLIND), (name, v)


def _decide(rt, schema, value) -> bool | None:
    from runtime_helpers import decide_text

    return decide_text(rt, schema, json.dumps(value))


@pytest.mark.parametrize("name", sorted(BAD))
def test_no_engine_accepts_a_listed_bad_value(name, runtimes):
    schema = {"type": "object", "properties": {"v": {"type": "string", "format": name}},
              "required": ["v"]}
    for engine in (*ENGINES, "auto"):
        for value in BAD[name]:
            assert not _decide(runtimes[engine], schema, {"v": value}), (engine, name, value)


# -- (b), (c) the suite's optional/format files ------------------------------------------------
def _suite_groups() -> dict[str, dict]:
    """The suite's format groups of every draft, by schema (``$schema`` left out: each
    standard format means the same in every draft that has it), instances merged."""
    groups: dict[str, dict] = {}
    for path in sorted(SUITES.glob("*/optional/format/*.json")):
        for group in json.loads(path.read_text(encoding="utf-8")):
            schema = {k: v for k, v in group["schema"].items() if k != "$schema"}
            key = json.dumps(schema, sort_keys=True)
            entry = groups.setdefault(key, {"schema": schema, "tests": {}})
            for test in group["tests"]:
                entry["tests"][json.dumps(test["data"], sort_keys=True)] = (
                    test["data"], bool(test["valid"]))
    return groups


@pytest.fixture(scope="module")
def suite_decisions(runtimes):
    """``{engine: [(schema, instance, valid, accepted or None if refused)]}``."""
    out = {}
    groups = _suite_groups()
    for engine in (*ENGINES, "auto"):
        rows = []
        for entry in groups.values():
            for data, valid in entry["tests"].values():
                rows.append((entry["schema"], data, valid,
                             _decide(runtimes[engine], entry["schema"], data)))
        out[engine] = rows
    return out


@pytest.mark.skipif(not SUITES.is_dir(), reason=f"no JSON Schema Test Suite at {SUITES}")
@pytest.mark.parametrize("engine", [*ENGINES, "auto"])
def test_no_engine_accepts_an_invalid_suite_instance(engine, suite_decisions):
    wrong = [(s.get("format"), d) for s, d, valid, accepted in suite_decisions[engine]
             if accepted and not valid]
    assert not wrong


#: Valid instances of the suite's format files accepted (of 377 valid, after merging the
#: drafts): the subsets' coverage (hostname labels up to 24 characters: 4 fewer than up to
#: 63, for a compile on xgrammar 3-4 times cheaper). Raise as it grows; lower only for such a
#: trade, said here.
COVERAGE_FLOORS = {"xgrammar": 281, "llguidance": 284, "auto": 284}


@pytest.mark.skipif(not SUITES.is_dir(), reason=f"no JSON Schema Test Suite at {SUITES}")
@pytest.mark.parametrize("engine", [*ENGINES, "auto"])
def test_valid_suite_instances_still_accepted(engine, suite_decisions, capsys):
    rows = suite_decisions[engine]
    by_format: dict[str, list[int]] = {}
    for schema, data, valid, accepted in rows:
        if valid and isinstance(data, str):
            counts = by_format.setdefault(str(schema.get("format")), [0, 0])
            counts[0] += bool(accepted)
            counts[1] += 1
    accepted = sum(bool(a) for _, _, valid, a in rows if valid)
    total = sum(valid for _, _, valid, _ in rows)
    with capsys.disabled():
        detail = ", ".join(f"{f} {a}/{n}" for f, (a, n) in sorted(by_format.items()))
        print(f"\n[formats] {engine}: {accepted}/{total} valid suite instances accepted "
              f"(strings: {detail})")
    assert accepted >= COVERAGE_FLOORS[engine]


# -- the lowering ------------------------------------------------------------------------------
def test_format_becomes_its_pattern():
    out = lower({"type": "string", "format": "date-time"}, approximate=True)
    assert out == {"type": "string", "pattern": FORMATS["date-time"].pattern}
    # An exact language is one in negated places too; a subset is not (the format stays,
    # and the engines refuse it).
    assert lower({"type": "string", "format": "ipv4"}) == {
        "type": "string", "pattern": FORMATS["ipv4"].pattern}
    assert lower({"type": "string", "format": "date-time"})["format"] == "date-time"


def test_fixed_length_bounds_are_decided():
    assert lower({"type": "string", "format": "date", "maxLength": 10}, approximate=True) == {
        "type": "string", "pattern": FORMATS["date"].pattern}
    assert lower({"type": "string", "format": "uuid", "maxLength": 35}) is False
    assert lower({"type": ["string", "null"], "format": "uuid", "minLength": 40}) == {
        "type": "null"}


def test_pattern_beside_a_pattern_needs_both():
    out = lower({"type": "string", "format": "ipv4", "pattern": "^1"})
    # (the format's pattern in an allOf branch of its own: split per type there, as an
    # untyped pattern is not enforced by xgrammar)
    assert out["pattern"] == "^1" and json.dumps(FORMATS["ipv4"].pattern) in json.dumps(
        out["allOf"])


def test_enum_beside_a_format_keeps_only_values_of_our_language():
    schema = {"type": "string", "format": "date-time",
              "enum": ["2020-01-01T00:00:00Z", "x", "1998-12-31T23:59:60Z"]}
    assert lower(schema, approximate=True) == {"enum": ["2020-01-01T00:00:00Z"]}
    # Lowered exactly (as where the schema is negated), a subset format stays beside the
    # values where the validator's check of it is loose (the engines then refuse it).
    exact = {"type": "string", "format": "email", "enum": ["a@b", "x"]}
    assert lower(exact) == exact


@pytest.mark.parametrize("schema, instance", [
    ({"not": {"type": "string", "format": "date-time"}}, "2020-01-01T00:00:00Z"),
    ({"not": {"type": "string", "format": "date-time"}}, "x"),
    ({"type": "string", "format": "ipv4", "pattern": "^1"}, "10.0.0.1"),
    ({"type": "string", "format": "ipv4", "pattern": "^1"}, "20.0.0.1"),
    ({"type": "string", "format": "email", "maxLength": 8}, "ab@cd.ef"),
    ({"type": "string", "format": "email", "maxLength": 7}, "ab@cd.ef"),
    ({"format": "date"}, 3),
    ({"oneOf": [{"type": "string", "format": "hostname"}, {"type": "integer"}]}, "a.b"),
])
def test_engines_accept_only_what_the_strict_checker_does(schema, instance, runtimes):
    import jsonschema

    cls = jsonschema.Draft202012Validator
    expected = cls(schema, format_checker=cls.FORMAT_CHECKER).is_valid(instance)
    for engine in (*ENGINES, "auto"):
        decided = _decide(runtimes[engine], schema, instance)
        # Sound: refused, or accepting only valid values (a subset may reject some).
        assert expected or not decided, (engine, schema, instance, decided)


# -- refusals ------------------------------------------------------------------------------------
def test_a_format_left_by_the_lowering_is_refused():
    from portable_guided.runtime.json_semantics import format_unsupported

    left = {"not": {"type": "string", "format": "date-time"}}  # (as lowered exactly)
    for engine in ENGINES:
        (why,) = format_unsupported(left, engine)
        assert why.startswith("/not: format 'date-time' is enforced only as a subset"), why
    assert format_unsupported(lower({"type": "string", "format": "ipv4"}), "xgrammar") == []


def test_an_entry_refusing_an_engine_refuses_its_pattern(monkeypatch):
    import dataclasses

    from portable_guided.runtime import json_semantics

    entry = dataclasses.replace(FORMATS["ipv4"], refused={"xgrammar": "a reason"})
    monkeypatch.setitem(json_semantics._FORMAT_PATTERNS, entry.pattern, entry)
    monkeypatch.setitem(json_semantics._REFUSING, "xgrammar", True)
    lowered = lower({"type": "string", "format": "ipv4"})
    assert json_semantics.xgrammar_unsupported(lowered) == [
        "/: format 'ipv4' is refused on xgrammar: a reason"]
    assert json_semantics.format_unsupported(lowered, "llguidance") == []
    assert entry.status("xgrammar") == "refused" and entry.status("llguidance") == "exact"


# -- the engines read our regexes as Python does -----------------------------------------------
def _mutants(values: list[str], n: int, seed: int = 0) -> list[str]:
    """``n`` strings one edit (delete, insert, replace a character) away from ``values``:
    near the language's border, where a dialect difference would show."""
    import random

    r = random.Random(seed)
    alphabet = "09aZ:-.@/T+%~#?[]_ "
    out = []
    while len(out) < n:
        v = r.choice(values)
        i = r.randrange(len(v) + 1)
        kind = r.randrange(3)
        if kind == 0 and v:
            v = v[:max(i - 1, 0)] + v[i:]
        elif kind == 1:
            v = v[:i] + r.choice(alphabet) + v[i:]
        elif v:
            j = min(i, len(v) - 1)
            v = v[:j] + r.choice(alphabet) + v[j + 1:]
        out.append(v)
    return out


@pytest.mark.parametrize("name", ["date-time", "hostname", "ipv6", "email", "uri", "duration"])
def test_engines_accept_near_misses_only_where_the_regex_does(name, runtimes):
    values = [d for e in _suite_groups().values() if e["schema"].get("format") == name
              for d, valid in e["tests"].values() if valid and isinstance(d, str)]
    values += EDGES.get(name, [])
    pattern = FORMATS[name].pattern
    schema = {"type": "string", "format": name}
    for engine in (*ENGINES, "auto"):
        for v in _mutants(values, 25):
            if _decide(runtimes[engine], schema, v):
                assert re.fullmatch(pattern, v), (engine, name, v)
