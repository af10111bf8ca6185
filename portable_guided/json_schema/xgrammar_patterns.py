"""Regex patterns of JSON schemas, rewritten so that xgrammar matches what they say.

xgrammar compiles a schema's ``pattern`` (and ``patternProperties`` names) into one automaton
(``RegexFSMBuilder``, "json_string" regexes), where two constructions accept more than the
regex (xgrammar 0.2.8; found by the MaskBench differential, Github_medium o22092, and pinned by
a random-regex test against Python's ``re``):

- ``(X)?`` adds an epsilon edge from X's start to X's first end state; when that end state
  has outgoing edges (X ends in a loop, ``(:[^\\s]+)?``), the rest of X can be read without
  its beginning: ``^a(:b+)?$`` accepts ``"ab"``;
- ``(X){n,}`` jumps back from every end to the *first* end state of the n-th copy and can go
  on inside that copy from there.

Both only matter when X is a group (a single character or class has an end state with no
edges), and each has an exact equivalent xgrammar builds soundly: ``(X){0,1}`` (a fresh
accepting start state) and ``(X){n}(X)*`` (Thompson's star). Regexes compiled on their own
(``GrammarSpec.regex``) go through another converter that is not affected. The schema-level
walk is ``xgrammar_forms.xgrammar_exact_strings``.
"""

from __future__ import annotations

import re
from collections.abc import Iterator

__all__ = ["LARGEST_JSON_REPEAT", "MAX_ESCAPED_MIN_LENGTH", "ends_anchored", "exact_pattern",
           "PYTHON_SET_OPERATIONS", "decides_match", "has_anchor", "hoisted_anchors", "interior_anchor", "largest_repeat", "may_match",
           "names_control_character", "needs_escaped_character", "patterns_disjoint",
           "top_level_branches", "unwrapped"]

#: The largest repeat count (``{n}``, ``{n,m}``) xgrammar 0.2.8 builds with JSON's string
#: rules. Above it, it builds the repeat another way, where ``.`` and negated classes also
#: match a raw ``"``, ``\`` or control character (``^.{0,10000}$`` accepted ``"a"b"``, text
#: that is not JSON); with its compiler cache on, counts up to 4096 fail to compile instead.

_OPEN_COUNT = re.compile(r"\{(\d+),\}")
_COUNT = re.compile(r"(?<!\\)\{(\d+)(?:,(\d*))?\}")
LARGEST_JSON_REPEAT = 128

#: The largest ``minLength`` (without ``maxLength``) the xgrammar engine writes as its own
#: rule with escapes (``xgrammar_exact``): each counted character is a rule xgrammar
#: compiles in about 20 ms.
MAX_ESCAPED_MIN_LENGTH = 16


def largest_repeat(pattern: str) -> int:
    """The largest number in the repeat counts of ``pattern`` (0 without any; a brace that
    is a literal may count too: the answer only errs upwards)."""
    return max((int(n) for m in _COUNT.finditer(pattern) for n in m.groups() if n), default=0)


def exact_pattern(pattern: str) -> str | None:
    """``pattern`` with the two constructions above replaced by their exact equivalents
    (``pattern`` itself when it has neither), or ``None`` when it cannot be scanned
    (unbalanced groups, a class opening with ``]``): a caller refuses those."""
    out: list[str] = []
    groups: list[int] = []  # where each open group starts in `out`
    i, n = 0, len(pattern)
    while i < n:
        c = pattern[i]
        if c == "\\":
            if i + 1 >= n:
                return None
            out.append(pattern[i:i + 2])
            i += 2
        elif c == "[":
            end = _class_end(pattern, i)
            if end is None:
                return None
            out.append(pattern[i:end])
            i = end
        elif c == "(":
            groups.append(len(out))
            out.append(c)
            i += 1
        elif c == ")":
            if not groups:
                return None
            start = groups.pop()
            group = "".join(out[start:]) + ")"
            del out[start:]
            i += 1
            if pattern.startswith("?", i):
                out.append(group + "{0,1}")
                i += 1
            elif m := _OPEN_COUNT.match(pattern, i):
                low = int(m.group(1))
                out.append(f"{group}{{{low}}}{group}*" if low > 1 else
                           group + ("+" if low == 1 else "*"))
                i = m.end()
            else:
                out.append(group)
        else:
            out.append(c)
            i += 1
    return None if groups else "".join(out)


def needs_escaped_character(pattern: str) -> bool:
    """Whether ``pattern`` names a ``\\`` or ``"`` outside a character class: characters a
    JSON string holds only as escapes, which xgrammar's automaton never generates (it leaves
    them out of every range): such strings cannot be written (MaskBench Github_medium o36798,
    ``^\\\\d+/...``). Conservative: also true where the character is optional."""
    i = 0
    while i < len(pattern):
        c = pattern[i]
        if c == "\\":
            if pattern[i + 1:i + 2] in ("\\", '"'):
                return True
            i += 2
        elif c == "[":
            i = _class_end(pattern, i) or len(pattern)
        else:
            if c == '"':
                return True
            i += 1
    return False


#: Escapes naming a control character (U+0000-U+001F), which xgrammar 0.2.8 writes raw
#: inside a JSON string (invalid JSON): ``^\\t$`` let it write a tab byte, so did ``\\cI``
#: and ``\\u0009`` (found by soundness-by-generation, harness/generation.py).
_CONTROL_ESCAPE = re.compile(r"\\(?:[tnrfv0]|c[A-Za-z]|u00[01][0-9A-Fa-f]|x[01][0-9A-Fa-f])")


def names_control_character(pattern: str) -> bool:
    """Whether ``pattern`` names a control character (an escape such as ``\\t``, ``\\cC`` or
    ``\\u0009``, or the raw character) outside a negated character class (``[^\\x00-\\x1f]``
    excludes them). Conservative: also true where the character is optional."""
    if any(ord(c) < 0x20 for c in pattern):
        return True
    i = 0
    while i < len(pattern):
        if pattern.startswith("[^", i):
            i = _class_end(pattern, i) or len(pattern)
        elif pattern[i] == "\\":
            if _CONTROL_ESCAPE.match(pattern, i):
                return True
            i += 2
        else:
            i += 1
    return False


def interior_anchor(pattern: str) -> bool:
    """Whether ``pattern`` has a ``^`` or ``$`` anchor other than at its two ends or beside a
    top-level ``|`` (``^$|^a+$``). xgrammar 0.2.8 ignores such an anchor ("Anchor '$' in
    the middle of regex is ignored"), which can widen the language: ``a$b`` matches nothing,
    read without the anchor it matches ``ab``. Unreadable patterns (an unclosed class) are
    reported too."""
    anchors: list[int] = []
    splits: list[int] = []
    depth = 0
    try:
        for i, c in _plain_characters(pattern):
            if c in "^$":
                anchors.append(i)
            elif c == "(":
                depth += 1
            elif c == ")":
                depth -= 1
            elif c == "|" and depth == 0:
                splits.append(i)
    except _Unreadable:
        return True
    allowed = {0, len(pattern) - 1, *(j + 1 for j in splits), *(j - 1 for j in splits)}
    return any(a not in allowed or (pattern[a] == "^") != (a == 0 or a - 1 in splits)
               for a in anchors)


def _class_end(pattern: str, start: int) -> int | None:
    """Index just past the character class opening at ``start``."""
    i = start + 1
    if pattern.startswith("^", i):
        i += 1
    if pattern.startswith("]", i):  # `[]...]`: read differently by regex dialects
        return None
    while i < len(pattern):
        if pattern[i] == "\\":
            i += 2
        elif pattern[i] == "]":
            return i + 1
        else:
            i += 1
    return None


#: Characters with a meaning in a regex outside a class (a literal when escaped).
_REGEX_META = frozenset("\\.[]()*+?{}|^$")


def _literal_ends(pattern: str) -> tuple[str, str]:
    """The text every match of ``pattern`` starts with and ends with (as a whole-string
    match: only an anchored side has one), read from its plain characters (groups seen
    through) up to the first construct that is not one (a class, ``.``, ``\\d``, anything
    repeated, a group with a ``|`` in it). Empty for a side not anchored, and for both
    sides when ``pattern`` has a ``|`` outside every group or a ``(?`` other than ``(?:``
    (whose reach this does not read)."""
    if re.search(r"\(\?(?!:)", pattern) or len(top_level_branches(pattern)) > 1:
        return "", ""
    atoms: list[str | None] = []  # a literal character, or None for anything else
    opened: list[int] = []  # where each open group starts in `atoms`
    last = 0  # where the last atom (a group: all of it) starts
    i = 0
    while i < len(pattern):
        c = pattern[i]
        if c in "*+?{":
            atoms[last:] = [None] * (len(atoms) - last)  # (repeated: not a fixed text)
            end = pattern.find("}", i) if c == "{" else i
            i = (end if end >= 0 else len(pattern)) + 1
            continue
        if c == "(":
            close = _group_close(pattern, i)
            if close is None:
                return "", ""
            if "|" in (c for _, c in _plain_characters(pattern[i + 1:close])):
                last = len(atoms)  # (alternatives: no fixed text, but what precedes holds)
                atoms.append(None)
                i = close + 1
                continue
            opened.append(len(atoms))
            i += 3 if pattern.startswith("(?:", i) else 1
            continue
        if c == ")":
            last = opened.pop() if opened else 0
            i += 1
            continue
        last = len(atoms)
        if c == "\\":
            nxt = pattern[i + 1:i + 2]
            atoms.append(nxt if nxt and not nxt.isalnum() else None)
            i += 2
        elif c == "[":
            atoms.append(None)
            i = _class_end(pattern, i) or len(pattern)
        else:
            atoms.append(None if c in _REGEX_META else c)
            i += 1
    start = pattern.startswith("^")
    end = ends_anchored(pattern)
    body = atoms[1 if start else 0:len(atoms) - 1 if end else len(atoms)]

    def plain(seq: list[str | None]) -> str:
        out = []
        for a in seq:
            if a is None:
                break
            out.append(a)
        return "".join(out)

    return (plain(body) if start else "", plain(body[::-1])[::-1] if end else "")


def _group_close(pattern: str, start: int) -> int | None:
    """Index of the ``)`` closing the group that opens at ``start`` (None: unreadable or
    never closed)."""
    depth = 0
    try:
        for i, c in _plain_characters(pattern[start:]):
            depth += (c == "(") - (c == ")")
            if depth == 0:
                return start + i
    except _Unreadable:
        return None
    return None


def ends_anchored(pattern: str) -> bool:
    """Whether ``pattern`` ends with the ``$`` anchor (not an escaped ``\\$``)."""
    body = pattern[:-1]
    return pattern.endswith("$") and (len(body) - len(body.rstrip("\\"))) % 2 == 0


def patterns_disjoint(first: str, second: str) -> bool:
    """Whether no string matches both regexes, shown by the fixed text they start or end
    with (``^S_`` and ``^I_``; ``_id$`` and ``_at$``). False where that does not show it
    (they may well be disjoint): a caller that needs disjointness treats False as overlap."""
    (head1, tail1), (head2, tail2) = _literal_ends(first), _literal_ends(second)
    n, m = min(len(head1), len(head2)), min(len(tail1), len(tail2))
    return head1[:n] != head2[:n] or (m > 0 and tail1[-m:] != tail2[-m:])


def may_match(pattern: str, name: str) -> bool:
    """Whether the ECMA-262 regex ``pattern`` may find a match in ``name``, read by Python's
    ``re`` where it can (its ``\\w``, ``\\d``, ``\\s`` and ``$`` match at least what
    ECMA-262's do): True where Python cannot read it."""
    try:
        return re.search(pattern, name) is not None
    except (re.error, RecursionError, OverflowError):
        return True


#: What Python's ``re`` warns it may read as a set operation some day (ECMA-262 reads
#: them as the characters): a pattern holding one is not read by Python here.
PYTHON_SET_OPERATIONS = ("[[", "--", "&&", "~~", "||")


def has_anchor(pattern: str) -> bool:
    """Whether ``pattern`` has a ``^`` or ``$`` anchor anywhere (not escaped, not in a
    class); True where it cannot be read."""
    try:
        return any(c in "^$" for _, c in _plain_characters(pattern))
    except _Unreadable:
        return True


def decides_match(pattern: str, name: str) -> bool | None:
    r"""Whether the ECMA-262 regex ``pattern`` finds a match in ``name``, where Python's
    ``re`` reads both alike: an ASCII ``name`` with no line break (where ``\w``, ``\d``,
    ``\s`` and ``$`` mean the same in both) and a pattern in the syntax both share (no
    lookbehind, named group or inline flag, and no escape of a letter whose meaning
    differs: Python's ``\A`` is an anchor, ECMA-262's the letter; nor what Python warns
    it may read as a set operation some day, ``[[``, ``--``, ``&&``, ``~~``, ``||``). None
    where that does not hold."""
    if (not name.isascii() or "\n" in name or "\r" in name
            or any(op in pattern for op in PYTHON_SET_OPERATIONS)
            or re.search(r"\(\?(?![:=!])", pattern)
            or re.search(r"\\[A-Za-z]", re.sub(r"\\[dDwWsSbBnrtfvux\\]", "", pattern))):
        return None
    try:
        return re.search(pattern, name) is not None
    except (re.error, RecursionError, OverflowError):
        return None


def top_level_branches(pattern: str) -> list[str]:
    """``pattern`` split at its top-level ``|`` (not inside a group or a class, not
    escaped); one item where it has none or cannot be read (an unclosed class)."""
    branches, depth, start = [], 0, 0
    try:
        for i, c in _plain_characters(pattern):
            if c == "(":
                depth += 1
            elif c == ")":
                depth -= 1
            elif c == "|" and depth == 0:
                branches.append(pattern[start:i])
                start = i + 1
    except _Unreadable:
        return [pattern]
    return [*branches, pattern[start:]]


def unwrapped(pattern: str) -> str:
    """``pattern`` without the groups that span all of it (``((^a|b))`` is ``^a|b``):
    the same regex, the group being matched once, with nothing around it (not where a
    back-reference would count the groups differently)."""
    if re.search(r"\\[1-9]", pattern):
        return pattern
    while (group := _spanning_group(pattern)) is not None:
        pattern = group[1]
    return pattern


def hoisted_anchors(branch: str) -> str:
    """``branch`` (no top-level ``|``) with the anchors of a group that spans all of it
    moved outside: ``(^a+$)`` is ``^(a+)$``. The same regex: nothing is read before
    the group or after it. Groups with a ``|`` of their own are left as they are (the anchor
    would then cover the other branches too)."""
    group = _spanning_group(branch)
    if group is None or len(top_level_branches(group[1])) > 1:
        return branch
    opening, inner = group
    inner = hoisted_anchors(inner)
    head = "^" if inner.startswith("^") else ""
    tail = "$" if ends_anchored(inner) and len(inner) > len(head) else ""
    if not (head or tail):
        return branch
    return f"{head}{opening}{inner[len(head):len(inner) - len(tail)]}){tail}"


def _spanning_group(pattern: str) -> tuple[str, str] | None:
    """``(opening, content)`` of a plain or ``(?:`` group that spans all of ``pattern``
    (``(a)(b)`` is two groups, not one), else None."""
    opening = "(?:" if pattern.startswith("(?:") else "("
    if not (pattern.startswith("(") and pattern.endswith(")")) or (
            pattern.startswith("(?") and opening == "("):
        return None
    inner = pattern[len(opening):-1]
    return (opening, inner) if _balanced(inner) else None


def _balanced(text: str) -> bool:
    """Whether every group that opens in ``text`` closes in it, and none closes that did
    not open there (so ``(a)(b)`` is not taken for one group around ``a)(b``), and no
    escape is left open at its end (``a\\`` of ``(a\\)``)."""
    depth = 0
    try:
        for _, c in _plain_characters(text):
            depth += (c == "(") - (c == ")")
            if depth < 0:
                return False
    except _Unreadable:
        return False
    return depth == 0


class _Unreadable(ValueError):
    """A pattern :func:`_plain_characters` cannot read."""


def _plain_characters(pattern: str) -> Iterator[tuple[int, str]]:
    """``(index, character)`` of each character of ``pattern`` neither escaped nor inside a
    character class; raises :class:`_Unreadable` at an unclosed class or an escape left open
    at the end."""
    i = 0
    while i < len(pattern):
        c = pattern[i]
        if c == "\\":
            if i + 1 == len(pattern):
                raise _Unreadable(pattern)
            i += 2
        elif c == "[":
            end = _class_end(pattern, i)
            if end is None:
                raise _Unreadable(pattern)
            i = end
        else:
            yield i, c
            i += 1
