"""Exact rules in place of xgrammar's own, where its own are narrower than the schema.

xgrammar 0.2.8 (``Grammar.from_json_schema``) builds

- a ``number`` with ``minimum``/``maximum`` from at most 6 fraction digits (``{0,5}``/``{1,6}``
  repeats), so ``0.1234567`` is refused under ``maximum: 1`` although the schema allows it
  (MaskBench o3914, o45806: the engines disagreed);
- a string with ``minLength`` from a repeated character class with no escape sequence, so
  ``"a\\nb"`` is refused under ``minLength: 1`` (o71820).

Here such a schema is written as our own grammar, exact, and put in place of xgrammar's:

1. :func:`exact_placeholders` replaces it by a ``const`` string that cannot occur in the
   schema (xgrammar writes a const as one quoted literal);
2. xgrammar writes the grammar of that schema (``Grammar.from_json_schema``);
3. :func:`substitute_exact` puts our rule in place of each literal: :func:`range_rules` (every
   decimal in plain notation, ``-?int(.frac)?``, any number of digits, compared as the
   decimals written in the schema, not as binary floats; no exponent, as llguidance's
   ranges; for a ``multipleOf`` of ``10**-k``, which xgrammar ignores, at most ``k``
   fraction digits, llguidance's language too) or :func:`min_length_rules` (every JSON
   string of at least that many characters, escapes included, a surrogate pair counting as
   one character).

A string with ``maxLength`` keeps xgrammar's form (no escapes): our rule for it is exact too,
but xgrammar compiles it at about 20 ms per counted character (2.6 s for 128) where the
pattern costs 10-400 ms.
"""

from __future__ import annotations

import json
import re
import secrets
from collections.abc import Mapping
from decimal import Decimal
from typing import Any

from ..json_schema.keywords import ANNOTATIONS
from ..json_schema.numbers import decimal_places, plain_number_range
from ..json_schema.walk import map_schemas
from ..json_schema.xgrammar_patterns import MAX_ESCAPED_MIN_LENGTH
from .engines.base import EmptyLanguage, UnsupportedSpec

__all__ = ["drop_absent", "exact_placeholders", "min_length_rules", "range_rules", "substitute_exact"]

_LOWER = {"minimum": False, "exclusiveMinimum": True}
_UPPER = {"maximum": False, "exclusiveMaximum": True}
# A random part: no schema can be written to hold a placeholder's text in advance (a
# pattern xgrammar folds into the same literal, say).
_PLACEHOLDER = f"pg-exact-{secrets.token_hex(8)}-"
#: The placeholder of a property that must be absent, and its literal in xgrammar's grammar.
_ABSENT = f"{_PLACEHOLDER}absent"
_ABSENT_LITERAL = json.dumps(json.dumps(_ABSENT))

#: A bound: the decimal and whether it is exclusive.
Bound = tuple[Decimal, bool]


def _tightest(bounds: Mapping[str, Decimal], keys: Mapping[str, bool],
              lower: bool) -> Bound | None:
    best: Bound | None = None
    for key, strict in keys.items():
        if key not in bounds:
            continue
        value = bounds[key]
        if best is None or (value > best[0] if lower else value < best[0]) or (
                value == best[0] and strict):
            best = (value, strict)
    return best


def _range(node: Mapping[str, Any]) -> tuple[Bound | None, Bound | None] | None:
    """The tightest lower and upper bounds of a plain number range
    (:func:`~portable_guided.json_schema.numbers.plain_number_range`) whose type does not also name
    ``integer``, else ``None``."""
    types = node.get("type")
    bounds = plain_number_range(node)
    if bounds is None or isinstance(types, list) and "integer" in types:
        return None
    return _tightest(bounds, _LOWER, True), _tightest(bounds, _UPPER, False)


def _min_length(node: Mapping[str, Any]) -> int | None:
    """The ``minLength`` of a schema that holds only a type including ``string``, a
    ``minLength`` from 1 to :data:`MAX_ESCAPED_MIN_LENGTH` and annotations, else ``None``."""
    types = node.get("type")
    low = node.get("minLength")
    if not (types == "string" or isinstance(types, list) and "string" in types) or not (
            type(low) is int and 1 <= low <= MAX_ESCAPED_MIN_LENGTH):
        return None
    if any(k not in ("type", "minLength") and k not in ANNOTATIONS for k in node):
        return None
    return low


def exact_placeholders(text: str, rules: dict[str, str]) -> str:
    """The schema ``text`` with each ranged ``number`` schema and each short ``minLength``
    string replaced by a placeholder ``const``; the rules that replace each placeholder's
    literal in xgrammar's grammar are added to ``rules`` (``{literal: rules}``). ``text``
    itself when there is none (or when a placeholder's text occurs in the schema: then
    xgrammar's own forms stay)."""
    if '"minimum"' not in text and '"maximum"' not in text and '"exclusiveM' not in text and (
            '"minLength"' not in text) and "false" not in text and '"multipleOf"' not in text:
        return text
    schema = json.loads(text)
    if _PLACEHOLDER in json.dumps(schema):
        return text
    added = 0

    def replace(node: Mapping[str, Any]) -> Any:
        nonlocal added
        props = node.get("properties")
        if isinstance(props, Mapping) and any(v is False for v in props.values()):
            # A property that must be absent: xgrammar refuses a `false` schema, and a
            # property left out of `properties` would be free under additionalProperties.
            # Declared with a placeholder, its name stays out of the free names; the
            # alternatives that write it are then dropped (drop_absent).
            rules[_ABSENT_LITERAL] = ""
            added += 1
            node = {**node, "properties": {k: {"const": _ABSENT} if v is False else v
                                           for k, v in props.items()}}
        places = decimal_places(node)  # a multipleOf of 10**-places (money: 0.01)
        bounds = _range(node) if places is None else _range(
            {k: v for k, v in node.items() if k != "multipleOf"}) or (None, None)
        low = None if bounds is not None else _min_length(node)
        if bounds is None and low is None:
            return node
        index = len(rules)
        placeholder = f"{_PLACEHOLDER}{index}"
        try:
            rule = (range_rules(f"pg_number_{index}", *bounds, places=places)
                    if bounds is not None else min_length_rules(f"pg_string_{index}", low or 0))
        except UnsupportedSpec:
            return node  # an empty range (in a branch, say) is empty in xgrammar's too
        rules[json.dumps(json.dumps(placeholder))] = rule
        added += 1
        own = "number" if bounds is not None else "string"
        types = node["type"]
        others = [t for t in types if t != own] if isinstance(types, list) else []
        # (the other types take no bound: a type list stays as a branch beside)
        return {"anyOf": [{"const": placeholder}, {"type": others}]} if others else {
            "const": placeholder}

    out = map_schemas(schema, replace)
    return json.dumps(out) if added else text


def substitute_exact(ebnf: str, rules: Mapping[str, str]) -> str:
    """xgrammar's grammar text with each placeholder literal replaced by its rule (a literal
    may be absent: xgrammar writes no rule for a definition nothing refers to). Raises
    :class:`UnsupportedSpec` when a placeholder is left in another form (xgrammar wrote the
    const in a way not foreseen: refused, not guessed)."""
    if _ABSENT_LITERAL in rules:
        ebnf = drop_absent(ebnf)
    added: dict[str, None] = {}  # rule lines, each once (rules share their helpers)
    for literal, rule_text in rules.items():
        if literal == _ABSENT_LITERAL:
            continue
        if literal in ebnf:
            ebnf = ebnf.replace(literal, rule_text.split(" ", 1)[0])
            added.update(dict.fromkeys(rule_text.splitlines()))
    if _PLACEHOLDER in ebnf:
        raise UnsupportedSpec("xgrammar wrote a placeholder in a form not foreseen")
    return ebnf.rstrip("\n") + "\n" + "\n".join(added) + "\n"


def drop_absent(ebnf: str) -> str:
    """xgrammar's grammar text without the alternatives that write a property that must be
    absent (its value the placeholder of :func:`exact_placeholders`), and without the rules
    left with no alternative (a required property that must be absent: a rule that accepts
    nothing, dropped from the alternatives that use it in turn). Raises
    :class:`UnsupportedSpec` where the placeholder, or a rule left empty, is used inside a
    group or a repeat (a form not foreseen: refused, not guessed), and
    :class:`.engines.base.EmptyLanguage` when ``root`` is left with no alternative."""
    lines: dict[str, str] = {}
    rules: dict[str, tuple[list[tuple[str, list[str]]], str]] = {}
    for line in ebnf.splitlines():
        if line.strip():
            name, _, body = line.partition(" ::= ")
            lines[name] = line
            parsed = _alternatives(body)
            if parsed is not None:  # (else a Regex(...) or other opaque form: kept)
                rules[name] = parsed
    dead = {_ABSENT_LITERAL}
    edited: set[str] = set()
    changed = True
    while changed:
        changed = False
        for name, (alts, rest) in rules.items():
            if name in dead:
                continue
            kept = [a for a in alts if not any(item in dead for item in a[1])]
            if len(kept) < len(alts):
                changed = True
                rules[name] = (kept, rest)
                edited.add(name)
                if not kept:
                    dead.add(name)
    if "root" in dead:
        raise EmptyLanguage("the grammar accepts no output at all (a required property "
                            "must be absent)")
    out = []
    for name, line in lines.items():
        if name in dead:
            continue
        if name in edited:
            alts, rest = rules[name]
            line = f"{name} ::= ({' | '.join(text for text, _ in alts)}){rest}"
        if not dead.isdisjoint(_TOKEN.findall(line.partition(" ::= ")[2])):
            raise UnsupportedSpec("xgrammar wrote an absent property in a form not foreseen")
        out.append(line)
    return "\n".join(out) + "\n"


#: A token of xgrammar's grammar text: a literal, a character class, a name, a repeat's
#: bounds, or one character.
_TOKEN = re.compile(r'"(?:\\.|[^"\\])*"|\[(?:\\.|[^\]\\])*\]|[A-Za-z_]\w*|\{[^}]*\}|\S')
_QUANTIFIERS = ("*", "+", "?")


def _alternatives(body: str) -> tuple[list[tuple[str, list[str]]], str] | None:
    """A rule body of xgrammar's text, ``((a b) | (c)) (=(lookahead))``, as its top-level
    alternatives, each its text and the items of its own sequence (a group or a repeated
    item is not one of them), and the text after them; None for another form."""
    tokens = list(_TOKEN.finditer(body))
    if not tokens or tokens[0].group() != "(":
        return None
    alts: list[tuple[str, list[str]]] = []
    depth, start, own = 0, None, 0  # own: the depth of the alternative's own sequence
    items: list[str] = []
    for i, m in enumerate(tokens):
        t = m.group()
        nxt = tokens[i + 1].group() if i + 1 < len(tokens) else ""
        if t == "(":
            depth += 1
            if depth == 2 and start is None:
                start, own = m.start(), 2
            continue
        if t == ")":
            depth -= 1
            if depth == 0:
                if start is not None:
                    alts.append((body[start:m.start()].strip(), items))
                return alts, body[m.end():]
            continue
        if depth == 1 and t == "|":
            alts.append((body[start:m.start()].strip(), items))
            start, items = None, []
            continue
        if depth == 1 and start is None:
            start, own = m.start(), 1
        # An item of the alternative's own sequence (inside its parentheses, or bare), not
        # inside a group of it and not repeated.
        quantified = nxt in _QUANTIFIERS or nxt.startswith("{")
        if not quantified and depth == own:
            items.append(t)
    return None


#: A character of a JSON string written as it is, and the escapes (a surrogate pair is one
#: character; a lone surrogate is left out: it is no character).
_RAW = '[^\\0-\\x1f\\"\\\\]'
_HEX = "[0-9A-Fa-f]"
_ESCAPE_RULE = (
    f'pg_escape ::= ([\\"\\\\/bfnrt]) | ("u" [0-9A-Ca-cE-Fe-f] {_HEX} {_HEX} {_HEX}) | '
    f'("u" [Dd] [0-7] {_HEX} {_HEX}) | '
    f'("u" [Dd] [89ABab] {_HEX} {_HEX} "\\\\u" [Dd] [C-Fc-f] {_HEX} {_HEX})')


def min_length_rules(name: str, min_length: int) -> str:
    """EBNF rules (the first named ``name``) for the JSON strings (quotes included) of at
    least ``min_length`` characters, escapes included. Right-recursive on purpose: the same
    language as a repeat of a character rule costs xgrammar 20-30 ms per mask."""
    lines = [f'{name} ::= "\\"" pg_chars_{min_length}']
    for k in range(min_length, 0, -1):
        lines.append(f'pg_chars_{k} ::= ({_RAW} pg_chars_{k - 1}) | '
                     f'("\\\\" pg_escape pg_chars_{k - 1})')
    lines.append(f'pg_chars_0 ::= ("\\"") | ({_RAW} pg_chars_0) | ("\\\\" pg_escape pg_chars_0)')
    lines.append(_ESCAPE_RULE)
    return "\n".join(lines)


def range_rules(name: str, low: Bound | None, high: Bound | None,
                places: int | None = None) -> str:
    """EBNF rules (the first named ``name``) for the JSON numbers in plain notation
    (``-?(0|[1-9][0-9]*)(.[0-9]+)?``) from ``low`` to ``high`` (``None``: unbounded), each
    ``(decimal, exclusive)``, with at most ``places`` fraction digits (``None``: any
    number; a ``multipleOf`` of ``10**-places``). ``-0`` counts as 0. Raises
    :class:`UnsupportedSpec` for an empty range."""
    g = _Grammar(name, places)
    parts = []
    # Non-negative numbers: magnitudes from max(low, 0) up to high.
    if high is None or high[0] >= 0:
        start = low if low is not None and low[0] >= 0 else (Decimal(0), False)
        parts += g.magnitudes(start, high)
    # Negative numbers (and -0): "-" then magnitudes from max(-high, 0) up to -low.
    if low is None or low[0] <= 0:
        start = (-high[0], high[1]) if high is not None and high[0] <= 0 else (Decimal(0), False)
        end = None if low is None else (-low[0], low[1])
        parts += [f'"-" {p}' for p in g.magnitudes(start, end)]
    if not parts:
        raise UnsupportedSpec(f"number range {low}..{high} holds no number")
    return g.text(parts)


_DIGITS = "0123456789"
#: A fraction's bound: its digits (trailing zeros dropped) and whether it is exclusive.
_FracBound = tuple[str, bool]
#: A state of a fraction's digits: the bounds left and the digits left (None: any number).
_FracState = tuple[Any, Any, Any]


def _split(value: Decimal) -> tuple[int, str]:
    """A non-negative decimal as (integer part, fraction digits without trailing zeros)."""
    whole, _, frac = format(value, "f").partition(".")
    return int(whole), frac.rstrip("0")


def _digit_class(digits: list[str]) -> str:
    if len(digits) == 1:
        return f'"{digits[0]}"'
    lo, hi = digits[0], digits[-1]
    if len(digits) == ord(hi) - ord(lo) + 1:
        return f"[{lo}-{hi}]"
    return "[" + "".join(digits) + "]"


class _Grammar:
    """Rules interned by body: the same sub-language is one rule."""

    def __init__(self, name: str, places: int | None = None) -> None:
        self.name = name
        self.places = places  # the most fraction digits (None: any number)
        self.rules: dict[str, str] = {}  # body -> rule name
        self.frac_rules: dict[_FracState, str] = {}  # fraction state -> rule name
        self.frac_bodies: list[tuple[str, str]] = []

    def rule(self, body: str) -> str:
        if body not in self.rules:
            self.rules[body] = f"{self.name}_{len(self.rules) + 1}"
        return self.rules[body]

    def text(self, parts: list[str]) -> str:
        lines = [f"{self.name} ::= " + " | ".join(f"({p})" for p in parts)]
        lines += [f"{rule} ::= {body}" for body, rule in self.rules.items()]
        lines += [f"{rule} ::= {body}" for rule, body in self.frac_bodies]
        return "\n".join(lines)

    # -- magnitudes: an integer part, then an optional fraction ---------------------------

    def magnitudes(self, low: Bound, high: Bound | None) -> list[str]:
        """Alternatives for the non-negative numbers from ``low`` to ``high``."""
        a, alpha = _split(low[0])
        lo_frac: _FracBound = (alpha, low[1])
        if high is None:
            b, hi_frac = None, None
        else:
            b, beta = _split(high[0])
            hi_frac = (beta, high[1])
            if b < a:
                return []
        out = []
        if b == a:
            out += self._with_fraction(str(a), lo_frac, hi_frac)
        else:
            out += self._with_fraction(str(a), lo_frac, None)
            if b is None or b - a >= 2:
                free = self.rule(_any_fraction(self.places))
                out += [f"{i} {free}" for i in self._integers(a + 1, None if b is None else b - 1)]
            if b is not None:
                out += self._with_fraction(str(b), None, hi_frac)
        return out

    def _with_fraction(self, whole: str, low: _FracBound | None,
                       high: _FracBound | None) -> list[str]:
        frac = self._fraction(low, high)
        if frac is None:
            return []
        empty_ok = _empty_fraction_ok(low, high)
        alternatives = ([""] if empty_ok else []) + [f'"." {frac}']
        return [f'"{whole}" ' + self.rule(" | ".join(f"({x})" if x else '""'
                                                     for x in alternatives))]

    def _integers(self, lo: int, hi: int | None) -> list[str]:
        """Alternatives for the integers ``lo``..``hi`` (``None``: unbounded) without
        leading zeros."""
        p = str(lo)
        if hi is not None and len(str(hi)) == len(p):
            return [self._same_length(p, str(hi))]
        out = [self._same_length(p, "9" * len(p))]
        if hi is None:
            out.append(f"[1-9] [0-9]{{{len(p)}, -1}}")
            return out
        q = str(hi)
        if len(q) - len(p) >= 2:
            out.append(f"[1-9] [0-9]{{{len(p)}, {len(q) - 2}}}")
        out.append(self._same_length("1" + "0" * (len(q) - 1), q))
        return out

    def _same_length(self, p: str, q: str) -> str:
        """Digit strings of ``len(p)`` from ``p`` to ``q`` (``p <= q``, same length)."""
        if not p:
            return '""'
        if p[0] == q[0]:
            return f'"{p[0]}" ' + self._same_length(p[1:], q[1:])
        rest = len(p) - 1
        alts = []
        first, last = int(p[0]), int(q[0])
        if p[1:] != "0" * rest:  # p's first digit only with the rest at least p's
            alts.append(f'"{p[0]}" ' + self._same_length(p[1:], "9" * rest))
            first += 1
        if q[1:] != "9" * rest:
            alts.append(f'"{q[0]}" ' + self._same_length("0" * rest, q[1:]))
            last -= 1
        if first <= last:  # every rest
            alts.append(_digit_class(list(_DIGITS[first:last + 1])) + _repeat(rest))
        return self.rule(" | ".join(f"({a})" for a in alts))

    # -- fractions: digit strings 0.s between two bounds ----------------------------------

    def _fraction(self, low: _FracBound | None, high: _FracBound | None) -> str | None:
        """A rule for the non-empty digit strings ``s`` (at most ``places`` of them) with
        ``0.s`` within the bounds, or ``None`` when there is none."""
        start = (low, high, self.places)
        live = _live_states(start)
        if start not in live:
            return None
        return self._fraction_rule(start, live)

    def _fraction_rule(self, state: _FracState, live: set[_FracState]) -> str:
        if state in self.frac_rules:
            return self.frac_rules[state]
        low, high, left = state
        if low is None and high is None:
            return "[0-9]+" if left is None else f"[0-9]{{1, {left}}}"
        # A state may lead back to itself ("0" under a strict lower bound of 0): name the
        # rule before its body refers to it.
        name = f"{self.name}_f{len(self.frac_rules) + 1}"
        self.frac_rules[state] = name
        groups: dict[_FracState, list[str]] = {}
        for d in _DIGITS:
            nxt = _next_state(state, d)
            if nxt is not None and (nxt in live or _empty_fraction_ok(nxt[0], nxt[1])):
                groups.setdefault(nxt, []).append(d)
        alts = []
        for nxt, digits in groups.items():
            head = _digit_class(digits)
            lo2, hi2, left2 = nxt
            if lo2 is None and hi2 is None:
                more = "*" if left2 is None else f"{{0, {left2}}}" if left2 else ""
                alts.append(f"{head} [0-9]{more}" if more else head)
                continue
            if nxt in live:
                alts.append(f"{head} {self._fraction_rule(nxt, live)}")
            if _empty_fraction_ok(lo2, hi2):
                alts.append(head)
        self.frac_bodies.append((name, " | ".join(f"({a})" for a in alts)))
        return name


def _any_fraction(places: int | None = None) -> str:
    return '"" | ("." [0-9]+)' if places is None else f'"" | ("." [0-9]{{1, {places}}})'


def _repeat(n: int) -> str:
    return "" if n == 0 else f" [0-9]{{{n}}}"


def _empty_fraction_ok(low: _FracBound | None, high: _FracBound | None) -> bool:
    """Whether no fraction (0.0) lies within the bounds."""
    return (low is None or low == ("", False)) and (high is None or high[0] != "" or not high[1])


def _step(low: _FracBound | None, high: _FracBound | None, d: str) -> tuple[Any, Any] | None:
    """The bounds left for the rest of the digits after ``d`` (``None``: out of range)."""
    if low is not None:
        digits, strict = low
        if not digits:
            low = None if not strict or d != "0" else low
        elif d > digits[0]:
            low = None
        elif d == digits[0]:
            low = (digits[1:], strict)
        else:
            return None
    if high is not None:
        digits, strict = high
        if not digits:
            if strict or d != "0":
                return None
        elif d < digits[0]:
            high = None
        elif d == digits[0]:
            high = (digits[1:], strict)
        else:
            return None
    return low, high


def _next_state(state: _FracState, d: str) -> _FracState | None:
    """The state after the digit ``d`` (``None``: out of range, or no digit left)."""
    low, high, left = state
    if left == 0:
        return None
    bounds = _step(low, high, d)
    if bounds is None:
        return None
    return bounds[0], bounds[1], None if left is None else left - 1


def _live_states(start: _FracState) -> set[_FracState]:
    """The states (bounds left, digits left) reachable from ``start`` that some non-empty
    digit string satisfies."""
    seen: dict[_FracState, list[_FracState]] = {}
    todo = [start]
    while todo:
        state = todo.pop()
        if state in seen:
            continue
        nexts = [n for d in _DIGITS if (n := _next_state(state, d)) is not None]
        seen[state] = nexts
        todo += nexts
    live = {s for s, nexts in seen.items()
            if any(_empty_fraction_ok(n[0], n[1]) for n in nexts)}
    changed = True
    while changed:
        changed = False
        for s, nexts in seen.items():
            if s not in live and any(n in live for n in nexts):
                live.add(s)
                changed = True
    return live

