"""Token masks that many JSON schemas share, computed before the first schema needs them.

xgrammar's compiler cache keeps each rule's token masks keyed by the rule's automaton and
hands them to any later grammar with the same rule (``COMPILER_CACHE_BYTES``). The rules
that cost the most recur from schema to schema: a string's length bound (every count is a
state whose mask walks the whole vocabulary: 0.37 s for the first ``maxLength: 50`` at
DeepSeek's 128k vocabulary, 2.3 s for 255), a format's pattern (an email 0.33 s), and the
way out of each declared name of an open object (one rule per letter left out, and the
pieces of a way out of several letters, ``xgrammar_free_names``). The first schema that
holds one pays for it; later ones compile in
milliseconds. :func:`prewarm_schemas` lists small schemas made of those rules, and
:func:`prewarm` compiles them through the engine's own path (the same lowering, so the same
rule text and automaton as a real schema's).

The runtime runs it once at start, in the background at the lowest priority
(``CompileService``, ``engine_prewarm``): about 28 s of one core and 320 MiB of the
compiler cache at DeepSeek's vocabulary; it shortens the engine upgrades of new schemas
that the rules are in (``bench/bench_prewarm.py``).
"""

from __future__ import annotations

import itertools
import logging
import string
import threading
from collections.abc import Iterator
from typing import Any

from ..specs import GrammarSpec
from .xgrammar_free_names import NAME_BLOCKS

__all__ = ["LENGTH_MAXIMA", "NAME_FIRST_CHARACTERS", "PIECE_LETTERS_MAX", "PREWARM_FORMATS",
           "SEED_SCHEMA", "free_name_piece_schemas", "prewarm", "prewarm_schemas"]

log = logging.getLogger(__name__)

#: ``maxLength`` values warmed, each with ``minLength`` 0 and 1: round numbers up to the
#: largest bound written as a pattern (128) and VARCHAR's 255. A bound above 128 is
#: xgrammar's own repeat, about 0.85 s for each new one, shared with no other: only 255 is
#: worth it (the most common bound in MaskBench's schemas: 204 of 7,818 have a string with
#: ``maxLength: 255`` and no pattern or format).
LENGTH_MAXIMA = (2, 3, 4, 5, 6, 8, 10, 12, 16, 20, 24, 25, 30, 32, 36, 40, 45, 48, 50, 60,
                 64, 80, 96, 100, 128, 255)

#: Formats whose pattern rules are warmed (those of :mod:`...json_schema.formats` that real
#: schemas name most; one refused by xgrammar is skipped).
PREWARM_FORMATS = ("date-time", "date", "time", "uri", "uri-reference", "email", "uuid",
                   "hostname", "ipv4", "ipv6")

#: Compiled first: a closed object of the common value types. The first grammar that holds one
#: of xgrammar's shared JSON rules (``basic_string_sub`` ...) decides how that rule's masks
#: are kept: a later grammar that uses the rule as that one did reuses them as they are,
#: any other adapts them to its own context on every compile. An open object compiled first
#: made every later closed object pay that (BFCL_simple's compiles after the prewarm: 7.9 ms
#: at the median, 2.6 ms with this schema first; open objects' the same either way).
SEED_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "s": {"type": "string"}, "i": {"type": "integer"}, "n": {"type": "number"},
        "b": {"type": "boolean"}, "a": {"type": "array", "items": {"type": "string"}},
        "o": {"type": "object", "properties": {"t": {"type": "string"}}, "required": ["t"],
              "additionalProperties": False},
    },
    "required": ["s", "i"],
    "additionalProperties": False,
}

#: First characters of declared property names: an open object's free name leaves out the
#: next letter of each declared name, one shared rule per letter left out.
NAME_FIRST_CHARACTERS = string.ascii_letters + string.digits + "_$@"


#: The most letters of one block (``xgrammar_free_names.NAME_BLOCKS``) left out by a way out
#: whose piece is warmed; a piece leaving out more is a walk over that block's tokens only.
PIECE_LETTERS_MAX = 3


def prewarm_schemas() -> Iterator[dict[str, Any]]:
    """The schemas :func:`prewarm` compiles: :data:`SEED_SCHEMA`, then the rest cheapest
    first (names about 30 ms each, formats up to 0.35 s, lengths growing with the bound)."""
    yield SEED_SCHEMA
    for char in NAME_FIRST_CHARACTERS:
        yield {"type": "object", "properties": {char: {"type": "string"}}}
    yield from free_name_piece_schemas()
    for name in PREWARM_FORMATS:
        yield {"type": "string", "format": name}
    for maximum in LENGTH_MAXIMA:
        yield {"type": "string", "maxLength": maximum}
        yield {"type": "string", "minLength": 1, "maxLength": maximum}


def free_name_piece_schemas() -> Iterator[dict[str, Any]]:
    """Open objects whose first letters leave out, block by block, every set of up to
    :data:`PIECE_LETTERS_MAX` lowercase letters of a block (one letter of the last block): the
    shared pieces of a way out of several letters (``xgrammar_free_names``), a few
    milliseconds each."""
    def left_out(block: str) -> list[str]:  # "" first: the block whole
        most = PIECE_LETTERS_MAX if block.islower() else 1
        return ["".join(c) for n in range(most + 1) for c in itertools.combinations(block, n)]

    subsets = [left_out(block) for block in NAME_BLOCKS]
    for k in range(1, max(map(len, subsets))):
        letters = "".join(sets[k] if k < len(sets) else "" for sets in subsets)
        if len(letters) < 2:  # (one letter left out is a rule of its own, warmed above)
            letters += "a" if "a" not in letters else "b"
        yield {"type": "object", "properties": {c + "q": {"type": "string"} for c in letters}}


def prewarm(engine: Any, stop: threading.Event | None = None) -> tuple[int, int]:
    """Compile :func:`prewarm_schemas` with ``engine`` (an ``XGrammarEngine``) one at a time,
    until ``stop`` is set; returns ``(compiled, failed)``. A schema the engine refuses is
    counted as failed and skipped (the rest still help)."""
    compiled = failed = 0
    for schema in prewarm_schemas():
        if stop is not None and stop.is_set():
            break
        try:
            engine.compile(GrammarSpec.json_schema(schema))
            compiled += 1
        except Exception as exc:  # noqa: BLE001 - a warm-up never fails the runtime
            failed += 1
            log.debug("prewarm of %s failed: %s", schema, exc)
    return compiled, failed
