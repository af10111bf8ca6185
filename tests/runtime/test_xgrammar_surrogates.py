"""No UTF-16 surrogate in xgrammar's grammars: the bytes ED A0..BF (a surrogate encoded as
UTF-8, which is not UTF-8) are refused inside JSON strings, negated pattern classes, pattern
dots and regex specs, while real text in the same range (Hangul, ED 80..9F) still passes."""

from __future__ import annotations

import pytest

from portable_guided.runtime import GrammarSpec, load_tokenizer_info
from portable_guided.runtime.engines import create_engine
from portable_guided.runtime.engines.xgrammar_surrogates import (
    ANY_DOT,
    exclude_regex_surrogates,
    exclude_surrogates,
)

pytest.importorskip("xgrammar")


@pytest.fixture(scope="module")
def engine_and_bytes():
    info = load_tokenizer_info("smollm2")
    engine = create_engine("xgrammar", info)
    from portable_guided.runtime.engines.xgrammar import tokenizer

    vocab = tokenizer(info).decoded_vocab
    single = {}
    for token_id, text in enumerate(vocab):
        if len(text) == 1:
            single.setdefault(text[0], token_id)
    return engine, single


def walk(engine, single, spec: GrammarSpec, data: bytes) -> list[bool]:
    """Whether each byte of ``data`` is accepted, one single-byte token at a time."""
    matcher = engine.new_matcher(engine.compile(spec))
    out = []
    for byte in data:
        ok = matcher.accept(single[byte])
        out.append(ok)
        if not ok:
            break
    return out


SURROGATE = b"\xed\xa0\x80"  # U+D800 as UTF-8 would spell it
HANGUL = "\ud55c".encode()  # U+D55C, ED 95 9C: real text


@pytest.mark.parametrize("spec", [
    GrammarSpec.json_schema({"type": "string"}),
    GrammarSpec.json_schema({"maximum": 10}),  # any value (the suite's ref.json#19)
    GrammarSpec.json_schema({"type": "string", "pattern": "^[^x]+$"}),
    GrammarSpec.json_schema({"type": "string", "pattern": "^a.+$"}),
    GrammarSpec.json_schema({"type": "string", "maxLength": 8}),
], ids=["string", "any", "negated-class", "dot", "length"])
def test_json_strings_refuse_a_surrogate_and_take_hangul(engine_and_bytes, spec):
    engine, single = engine_and_bytes
    prefix = b'"a' if "a." in spec.text else b'"'
    assert walk(engine, single, spec, prefix + SURROGATE) == [True] * (len(prefix) + 1) + [False]
    assert all(walk(engine, single, spec, prefix + HANGUL + b'"'))


def test_a_regex_spec_refuses_a_surrogate(engine_and_bytes):
    engine, single = engine_and_bytes
    spec = GrammarSpec.regex("a.b")
    assert walk(engine, single, spec, b"a" + SURROGATE) == [True, True, False]
    assert all(walk(engine, single, spec, b"a" + HANGUL + b"b"))
    assert all(walk(engine, single, spec, b"a\nb"))  # xgrammar's dot, newline included


def test_rewrites_leave_escapes_and_positive_classes_alone():
    assert exclude_regex_surrogates(r"\.[.^][^\]]a.") == (
        r"\.[.^][^\uD800-\uDFFF\]]a[^\n\r\u2028\u2029\uD800-\uDFFF]")
    assert exclude_regex_surrogates("x.", dot=ANY_DOT) == r"x[^\uD800-\uDFFF]"
    # xgrammar's EBNF: string literals untouched, each negated class, and a Regex literal's
    # classes and dots in that literal's escaping (a regex backslash written twice, "?" once).
    ebnf = 'r ::= "[^a]" [^"\\\\] Regex("^[\\\\]a]\\\\.\\?.$")'
    assert exclude_surrogates(ebnf) == (
        'r ::= "[^a]" [^\\uD800-\\uDFFF"\\\\] '
        'Regex("^[\\\\]a]\\\\.\\?[^\\\\n\\\\r\\\\u2028\\\\u2029\\\\uD800-\\\\uDFFF]$")')
