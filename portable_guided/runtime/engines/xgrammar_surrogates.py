r"""UTF-16 surrogates out of xgrammar's grammars: xgrammar decodes UTF-8 leniently, so a
negated class (``[^"\\]``, a JSON string's character) or a regex ``.`` also matches the
bytes ``ED A0..BF xx``, a surrogate code point encoded as UTF-8, which is not UTF-8: a
model could write a JSON text no decoder reads (found by random walks through the masks,
tests/harness/test_generation.py). Excluding ``\uD800-\uDFFF`` from every negated class and
every ``.`` refuses those bytes and nothing else.

>>> exclude_surrogates(r'root ::= "\"" [^"\\\0-\x1f]* "\""')
'root ::= "\\"" [^\\uD800-\\uDFFF"\\\\\\0-\\x1f]* "\\""'
>>> exclude_surrogates(r'r ::= Regex("^[^x]+$", json_string=true)')
'r ::= Regex("^[^\\\\uD800-\\\\uDFFFx]+$", json_string=true)'
>>> exclude_regex_surrogates(r"a.b[.^]\.[^\]]")
'a[^\\n\\r\\u2028\\u2029\\uD800-\\uDFFF]b[.^]\\.[^\\uD800-\\uDFFF\\]]'
"""

from __future__ import annotations

from collections.abc import Callable

__all__ = ["ANY_DOT", "ECMA_DOT", "exclude_regex_surrogates", "exclude_surrogates"]

_SURROGATES = r"\uD800-\uDFFF"
#: ECMA-262's ``.`` (no ``s`` flag: no line terminators), less the surrogates: the ``.`` of a
#: JSON Schema ``pattern`` (xgrammar's own ``.`` also matches line terminators).
ECMA_DOT = r"[^\n\r\u2028\u2029\uD800-\uDFFF]"
#: xgrammar's ``.`` (any character), less the surrogates: a regex spec's.
ANY_DOT = r"[^\uD800-\uDFFF]"


def exclude_regex_surrogates(pattern: str, dot: str = ECMA_DOT) -> str:
    """``pattern`` (a regex) with surrogates excluded from each negated class, and each
    ``.`` outside a class written as ``dot``."""
    return _rewrite([(ch, ch) for ch in pattern], dot, lambda text: text)


def _rewrite(tokens: list[tuple[str, str]], dot: str, encode: Callable[[str], str]) -> str:
    """The regex spelled by ``tokens`` (each: the regex character, its source text) with the
    exclusions; inserted regex text goes through ``encode`` into the source's spelling."""
    out: list[str] = []
    in_class = False
    i = 0
    while i < len(tokens):
        ch, source = tokens[i]
        if ch == "\\":  # an escape: this and the next token as they are
            out.extend(src for _, src in tokens[i:i + 2])
            i += 2
            continue
        if in_class:
            in_class = ch != "]"
            out.append(source)
        elif ch == "[":
            in_class = True
            out.append(source)
            if i + 1 < len(tokens) and tokens[i + 1][0] == "^":
                out.append(tokens[i + 1][1] + encode(_SURROGATES))
                i += 1
        elif ch == ".":
            out.append(encode(dot))
        else:
            out.append(source)
        i += 1
    return "".join(out)


def _literal_tokens(literal: str) -> list[tuple[str, str]]:
    """The characters of the inside of an EBNF string literal, each with its spelling there
    (xgrammar writes a backslash as ``\\\\``, quotes and ``?`` escaped, controls as
    ``\\n``, ``\\xNN``...)."""
    tokens = []
    i = 0
    while i < len(literal):
        if literal[i] != "\\":
            tokens.append((literal[i], literal[i]))
            i += 1
            continue
        kind = literal[i + 1]
        width = {"x": 4, "u": 6, "U": 10}.get(kind, 2)
        source = literal[i:i + width]
        if width > 2:
            ch = chr(int(source[2:], 16))  # noqa: FURB166 - "\\x1f" is no int() prefix
        else:
            ch = {"n": "\n", "r": "\r", "t": "\t", "0": "\0"}.get(kind, kind)
        tokens.append((ch, source))
        i += width
    return tokens


def exclude_surrogates(ebnf: str) -> str:
    """xgrammar's EBNF text ``ebnf`` with surrogates excluded from every negated character
    class and from every ``Regex("...")`` rule's negated classes and ``.`` (a JSON Schema
    pattern's: ECMA-262's ``.``)."""
    out: list[str] = []
    i = 0
    while i < len(ebnf):
        if ebnf.startswith('Regex("', i):
            end = _string_end(ebnf, i + 6)
            tokens = _literal_tokens(ebnf[i + 7:end])
            out.append('Regex("' + _rewrite(tokens, ECMA_DOT, _escaped) + '"')
            i = end + 1
            continue
        ch = ebnf[i]
        if ch == '"':  # a literal string: copied as it is
            end = _string_end(ebnf, i)
            out.append(ebnf[i:end + 1])
            i = end + 1
        elif ebnf.startswith("[^", i):
            end = _class_end(ebnf, i)
            out.append("[^" + _SURROGATES + ebnf[i + 2:end + 1])
            i = end + 1
        elif ch == "[":
            end = _class_end(ebnf, i)
            out.append(ebnf[i:end + 1])
            i = end + 1
        else:
            out.append(ch)
            i += 1
    return "".join(out)


def _escaped(regex: str) -> str:
    """Regex text as the inside of an EBNF string literal (only backslashes occur in what
    is inserted)."""
    return regex.replace("\\", "\\\\")


def _string_end(text: str, start: int) -> int:
    """Index of the quote closing the string literal opened at ``start``."""
    i = start + 1
    while text[i] != '"':
        i += 2 if text[i] == "\\" else 1
    return i


def _class_end(text: str, start: int) -> int:
    """Index of the ``]`` closing the character class opened at ``start``."""
    i = start + 1
    while text[i] != "]":
        i += 2 if text[i] == "\\" else 1
    return i
