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

The language is the same (a rule in place of the alternatives it names) and so is every
token mask (tests/runtime/test_xgrammar_free_names.py compares them along valid instances
and random walks); the compile is 2-5x faster on MaskBench's open objects
(bench/bench_free_names.py). Text that xgrammar writes otherwise is left as it is.
"""

from __future__ import annotations

import re

__all__ = ["share_free_name_tails"]

# One way out of a declared name, as xgrammar 0.2 writes it: a character other than the
# listed ones (group 1, xgrammar's escaping) then any string, or an escape then any string.
_WAY_OUT = re.compile(
    r'\(\[\^\\0-\\x1f\\"\\\\\\r\\n((?:\\.|[^\]\\])*)\] basic_string_sub\)'
    r' \| \("\\\\" basic_escape basic_string_sub\)')
# A state of a free name's trie, and the free name's own rule (which holds the lookahead).
_STATE = re.compile(r"^(\w+_addl_key)_\d+$")
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
        state = _STATE.match(name)
        if state is None or state.group(1) not in rules:
            out.append(line)
            continue
        found = _LOOKAHEAD.search(rules[state.group(1)])
        lookahead = found.group(1) if found else ""

        def shared_rule(way_out: re.Match[str], lookahead: str = lookahead) -> str:
            key = (way_out.group(1), lookahead)
            return shared.setdefault(key, f"{prefix}{len(shared)}")

        out.append(f"{name} ::= {_WAY_OUT.sub(shared_rule, body)}")
    for (excluded, lookahead), rule in shared.items():
        body = (rf'(([^\0-\x1f\"\\\r\n{excluded}] basic_string_sub) | ("\\" basic_escape '
                rf"basic_string_sub))")
        out.append(f"{rule} ::= {body} {lookahead}".rstrip())
    return "\n".join(out) + ("\n" if ebnf.endswith("\n") else "")
