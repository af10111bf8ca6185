r"""Open objects at a fraction of xgrammar's compile time: one rule per way out of a
declared name, shared by every state that takes it.

Where a schema allows properties it does not declare, xgrammar (``strict_mode=False``)
writes a free property name as a trie over the declared names: one rule per prefix of a
declared name, each with the alternatives "the closing quote", "the next letter of a
name" and "any other character, then any string":

    root_addl_key_3 ::= (("\"") | ([^\0-\x1f\"\\\r\nn] basic_string_sub)
                         | ("\\" basic_escape basic_string_sub) | ("n" root_addl_key_2))

xgrammar's compiler computes a token mask for every position of every rule, and for the
"any other character" position it walks the whole vocabulary through its parser: 12-16 ms
at a 128k vocabulary on one core for each prefix of each declared name, so 0.3-5 s for an
object of a few dozen names. That way out depends only on the letters it leaves out, and
most prefixes leave out one letter, so :func:`share_free_name_tails` moves it into one rule
per set of letters left out (with the key's lookahead, which keeps the masks as precise):

    root_addl_key_3 ::= (("\"") | pg_free_name_4 | ("n" root_addl_key_2))
    pg_free_name_4 ::= (([^\0-\x1f\"\\\r\nn] basic_string_sub)
                        | ("\\" basic_escape basic_string_sub)) (=([ \n\r\t]* [,}\]:]))

Where a state leaves out several letters (the first letters of an object's names, a fork
inside them), that set is the schema's own and its rule would still walk the whole
vocabulary (about 30 ms). Such a way out, when every letter is in :data:`NAME_BLOCKS`, is
written as the union of pieces whose text does not depend on the schema: the characters
outside every block (``pg_free_name_rest``), and each block less the letters it leaves
out. The pieces are few, small and shared (the prewarm compiles the common ones,
``xgrammar_prewarm``), so a new open object compiles in a few milliseconds; the state's mask
is a union of six masks instead of one (about 10 us more at DeepSeek's vocabulary).

    pg_free_name_3 ::= (pg_free_name_rest_L | pg_free_name_b0_61_62_L | pg_free_name_b1_L ...)
    pg_free_name_b0_61_62_L ::= (([cdef] basic_string_sub)) (=([ \n\r\t]* [,}\]:]))

(``_L`` a tag of the lookahead: pieces are named by their text).

Objects with the same declared names get tries with the same text but their own rule
names (the branches of an ``anyOf`` over ``required``, a definition reached twice): each
trie state costs a walk of the tokens that start with its letter (about 0.4 ms), so
:func:`merge_equal_tries` keeps one trie per text and points the others' uses at it
(Glaive's calculate_area schemas: 83 to 43 ms after the prewarm).

The language is the same (a rule in place of the alternatives it names, a class as the
union of its parts, one of two rules that differ only in their names) and so is every token
mask (tests/runtime/test_xgrammar_free_names.py
compares them along valid instances and random walks); the compile is 2-5x faster on
MaskBench's open objects (bench/bench_free_names.py). Text that xgrammar writes otherwise
is left as it is.
"""

from __future__ import annotations

import re
import zlib

__all__ = ["NAME_BLOCKS", "merge_equal_tries", "share_free_name_tails", "way_out_pieces"]

# One way out of a declared name, as xgrammar 0.2 writes it: a character other than the
# listed ones (group 1, xgrammar's escaping) then any string, or an escape then any string.
_WAY_OUT = re.compile(
    r'\(\[\^\\0-\\x1f\\"\\\\\\r\\n((?:\\.|[^\]\\])*)\] basic_string_sub\)'
    r' \| \("\\\\" basic_escape basic_string_sub\)')
#: The characters a way out of several letters is split by, one piece per block (a piece's
#: mask is a walk over the tokens that start in its block). Each piece is a stack top of the
#: state's mask: fewer blocks, cheaper masks; smaller blocks, cheaper new pieces.
NAME_BLOCKS = ("abcdef", "ghijklm", "nopqrs", "tuvwxyz",
               "ABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_")
_BLOCKED_TEXT = "".join(NAME_BLOCKS)
_BLOCKED = frozenset(_BLOCKED_TEXT)
# A rule of a free name's trie: the free name's own (which holds the lookahead), then its
# states (suffix ``_N``). A name from $defs keeps its "." or "-".
_TRIE_RULE = re.compile(r"^(\S+_addl_key)(_\d+)?$")
# A use of a rule name ending at ``_addl_key`` or a state's suffix (names hold "." and "-").
_NAME_END = r"(?=(?:_\d+)?(?![\w.\-]))"
_LOOKAHEAD = re.compile(r"\s(\(=\(.*\)\))$")


def share_free_name_tails(ebnf: str) -> str:
    r"""``ebnf`` (xgrammar's text for a JSON schema) with each way out of a declared name
    in one rule per set of excluded characters and lookahead; the same language and masks.

    >>> text = '\n'.join([
    ...     r'k ::= (("\"" k_2)) (=([ \n\r\t]* [,}\]:]))',
    ...     r'k_1 ::= (([^\0-\x1f\"\\\r\n] basic_string_sub) | ("\\" basic_escape '
    ...     r'basic_string_sub))',
    ...     r'k_2 ::= (("\"") | ([^\0-\x1f\"\\\r\na] basic_string_sub) | ("\\" basic_escape '
    ...     r'basic_string_sub) | ("a" k_1))']).replace("k", "root_addl_key")
    >>> for line in share_free_name_tails(text).splitlines()[1:]:
    ...     print(line[:72])
    root_addl_key_1 ::= (pg_free_name_0)
    root_addl_key_2 ::= (("\"") | pg_free_name_1 | ("a" root_addl_key_1))
    pg_free_name_0 ::= (([^\0-\x1f\"\\\r\n] basic_string_sub) | ("\\" basic_
    pg_free_name_1 ::= (([^\0-\x1f\"\\\r\na] basic_string_sub) | ("\\" basic
    """
    lines = ebnf.splitlines()
    rules = dict(line.partition(" ::= ")[::2] for line in lines)
    prefix = "pg_free_name_"
    while any(name.startswith(prefix) for name in rules):
        prefix = "pg_" + prefix
    shared: dict[tuple[str, str], str] = {}  # (excluded, lookahead) -> rule name
    out = []
    for line in lines:
        name, _, body = line.partition(" ::= ")
        state = _TRIE_RULE.match(name)
        if state is None or not state.group(2) or state.group(1) not in rules:
            out.append(line)
            continue
        found = _LOOKAHEAD.search(rules[state.group(1)])
        lookahead = found.group(1) if found else ""

        def shared_rule(way_out: re.Match[str], lookahead: str = lookahead) -> str:
            key = (way_out.group(1), lookahead)
            return shared.setdefault(key, f"{prefix}{len(shared)}")

        out.append(f"{name} ::= {_WAY_OUT.sub(shared_rule, body)}")
    pieces: dict[str, str] = {}
    for (excluded, lookahead), rule in shared.items():
        parts = way_out_pieces(excluded)
        if parts is None:
            out.append(f"{rule} ::= {_way_out(excluded)} {lookahead}".rstrip())
            continue
        names = []
        for part, kept in parts:
            piece = f"{prefix}{part}" + (f"_{_hex(lookahead)}" if lookahead else "")
            names.append(piece)
            body = _way_out(_BLOCKED_TEXT) if kept is None else f"(([{kept}] basic_string_sub))"
            pieces[piece] = f"{piece} ::= {body} {lookahead}".rstrip()
        out.append(f"{rule} ::= ({' | '.join(names)})")
    out.extend(pieces.values())
    return merge_equal_tries("\n".join(out) + ("\n" if ebnf.endswith("\n") else ""))


def merge_equal_tries(ebnf: str) -> str:
    r"""``ebnf`` with one free-name trie per text: a trie (``X_addl_key`` and its states
    ``X_addl_key_N``) whose rules read as an earlier trie's, names aside, is dropped and its
    uses point at the earlier one. The same language and masks, fewer rules to compile.

    >>> text = "\n".join(["a_addl_key ::= ((a_addl_key_1))", 'a_addl_key_1 ::= (("x"))',
    ...                   "b_addl_key ::= ((b_addl_key_1))", 'b_addl_key_1 ::= (("x"))',
    ...                   "root ::= ((a_addl_key b_addl_key))"])
    >>> print(merge_equal_tries(text))
    a_addl_key ::= ((a_addl_key_1))
    a_addl_key_1 ::= (("x"))
    root ::= ((a_addl_key a_addl_key))
    """
    lines = ebnf.splitlines()
    rules = dict(line.partition(" ::= ")[::2] for line in lines)
    tries: dict[str, list[tuple[str, str]]] = {}
    for name, body in rules.items():
        rule = _TRIE_RULE.match(name)
        if rule is not None and rule.group(1) in rules:
            tries.setdefault(rule.group(1), []).append((rule.group(2) or "", body))
    first_of: dict[tuple[tuple[str, str], ...], str] = {}
    merged: dict[str, str] = {}  # a trie dropped -> the trie with its text
    for trie, members in tries.items():
        use = re.compile(r"(?<![\w.\-])" + re.escape(trie) + _NAME_END)
        text = tuple(sorted((suffix, use.sub("@", body)) for suffix, body in members))
        kept = first_of.setdefault(text, trie)
        if kept != trie:
            merged[trie] = kept
    if not merged:
        return ebnf
    uses = re.compile(r"(?<![\w.\-])(" + "|".join(map(re.escape, merged)) + ")" + _NAME_END)
    out = []
    for line in lines:
        rule = _TRIE_RULE.match(line.partition(" ::= ")[0])
        if rule is None or rule.group(1) not in merged:
            out.append(uses.sub(lambda found: merged[found.group(1)], line))
    return "\n".join(out) + ("\n" if ebnf.endswith("\n") else "")


def way_out_pieces(excluded: str) -> list[tuple[str, str | None]] | None:
    """The pieces of a way out that leaves out the characters ``excluded`` (a class's text
    as xgrammar writes it): ``(name, kept characters)`` pairs, ``("rest", None)`` first
    (every character outside the blocks, and escapes), then each block less ``excluded``
    (a block left out whole has none); None where ``excluded`` is one character (its rule
    is shared as it is) or holds one outside :data:`NAME_BLOCKS`.

    >>> way_out_pieces("ba")
    [('rest', None), ('b0_61_62', 'cdef'), ('b1', 'ghijklm'), ('b2', 'nopqrs'), \
('b3', 'tuvwxyz'), ('b4', 'ABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_')]
    """
    # (xgrammar escapes no character of the blocks: an escape is a character outside them)
    if len(set(excluded)) < 2 or not _BLOCKED.issuperset(excluded):
        return None
    parts: list[tuple[str, str | None]] = [("rest", None)]
    for i, block in enumerate(NAME_BLOCKS):
        kept = "".join(c for c in block if c not in excluded)
        if kept:
            left_out = "".join(f"_{ord(c):x}" for c in block if c in excluded)
            parts.append((f"b{i}{left_out}", kept))
    return parts


def _way_out(excluded: str) -> str:
    """A character other than ``excluded`` (a class's text) then any string, or an escape
    then any string: xgrammar's way out of a declared name."""
    return (rf'(([^\0-\x1f\"\\\r\n{excluded}] basic_string_sub) | ("\\" basic_escape '
            rf"basic_string_sub))")


def _hex(text: str) -> str:
    """A rule-name-safe, stable tag of ``text`` (pieces under another lookahead differ)."""
    return format(zlib.crc32(text.encode()), "08x")
