"""Reproducers for the xgrammar 0.2.8 JSON-schema bugs this library works around, ready to
attach to upstream reports (docs/upstream.md). Needs only ``xgrammar``: the vocabulary is
the 256 single bytes, so every string can be walked byte by byte.

    python scripts/xgrammar_upstream_repro.py

Each case prints the text, whether JSON Schema (and JSON) accepts it, and whether xgrammar
does; a line marked BUG is one where they differ. Exit status 1 when any case is a BUG.
"""

from __future__ import annotations

import importlib.metadata
import json
import sys

import xgrammar as xgr

# (title, schema, text, accepted by JSON Schema / JSON)
CASES = [
    ("optional group: (X)? re-enters X after its first loop",
     {"type": "string", "pattern": "^a(:b+)?$"}, '"ab"', False),
    ("optional group, MaskBench Github_medium o22092",
     {"type": "string", "pattern": "^[^:\\s]+:[^:\\s]+(:[^\\s]+)?$"}, '"chrome:latest:"', False),
    ("(X){n,} re-enters the n-th copy of X at its first end",
     {"type": "string", "pattern": "^(:a*|b){1,}$"}, '"bba"', False),
    ("minLength: a raw tab inside the string (not JSON)",
     {"type": "string", "minLength": 1}, '"a\tb"', False),
    ("maxLength: a raw U+0001 inside the string (not JSON)",
     {"type": "string", "maxLength": 9}, '"a\x01b"', False),
    ("pattern [\\s\\S]{0,n} from n = 150: a raw tab (not JSON)",
     {"type": "string", "pattern": "^[\\s\\S]{0,150}$"}, '"a\tb"', False),
    ("a repeat above 128: a raw quote inside the string (not JSON)",
     {"type": "string", "pattern": "^.{0,10000}$"}, '"a"b"', False),
    ("a repeat above 128: a backslash before a letter (not JSON)",
     {"type": "string", "pattern": "^[^<>]{1,200}$"}, '"a\\qb"', False),
    ("format beside maxLength: the bound is dropped",
     {"type": "string", "format": "email", "maxLength": 5}, '"ab@cd.ef"', False),
    ("pattern beside maxLength: the bound is dropped",
     {"type": "string", "pattern": "^[0-9a-f]+$", "maxLength": 12}, '"0123456789abc"', False),
    ("multipleOf beside minimum: multipleOf is dropped (logged)",
     {"type": "integer", "minimum": 0, "multipleOf": 12}, "25", False),
    ("enum beside maxLength: maxLength is dropped",
     {"type": "string", "enum": ["a", "bb"], "maxLength": 1}, '"bb"', False),
    ("type beside anyOf: the type is dropped",
     {"type": "object", "anyOf": [{"type": "integer"}, {"type": "object"}]}, "3", False),
    ("type beside $ref: the type is dropped",
     {"type": "object", "$ref": "#/$defs/n", "$defs": {"n": {"type": ["integer", "object"]}}},
     "3", False),
    # The expected side of the narrowings (valid text xgrammar cannot produce), for reference:
    ("number with a range: more than 6 fraction digits rejected",
     {"type": "number", "minimum": 0, "maximum": 1}, "0.0160425", True),
    ("length-bounded string: no escape sequences",
     {"type": "string", "maxLength": 40}, '"GET / HTTP/1.1\\r\\n"', True),
]


def byte_tokenizer() -> xgr.TokenizerInfo:
    """A vocabulary of the 256 single bytes plus an end-of-text token (id 256)."""
    vocab = [bytes([b]) for b in range(256)] + [b"<eos>"]
    return xgr.TokenizerInfo(vocab, vocab_type=xgr.VocabType.RAW, stop_token_ids=[256])


def accepts(compiler: xgr.GrammarCompiler, schema: dict, text: str) -> bool:
    grammar = compiler.compile_json_schema(json.dumps(schema), any_whitespace=True,
                                           strict_mode=False)
    matcher = xgr.GrammarMatcher(grammar)
    return all(matcher.accept_token(b) for b in text.encode("utf-8")) and (
        matcher.accept_token(256))


def main() -> int:
    compiler = xgr.GrammarCompiler(byte_tokenizer(), max_threads=1, cache_enabled=False)
    bugs = 0
    for title, schema, text, expected in CASES:
        got = accepts(compiler, schema, text)
        bugs += got != expected
        mark = "BUG " if got != expected else "ok  "
        print(f"{mark} {title}\n     schema {json.dumps(schema)}\n     text {text!r}: "
              f"JSON Schema {'accepts' if expected else 'rejects'}, xgrammar "
              f"{'accepts' if got else 'rejects'}")
    version = importlib.metadata.version("xgrammar")
    print(f"xgrammar {version}: {bugs} of {len(CASES)} cases differ from JSON Schema")
    return 1 if bugs else 0


if __name__ == "__main__":
    sys.exit(main())
