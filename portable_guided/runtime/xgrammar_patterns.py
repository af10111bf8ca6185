"""Where xgrammar's pattern rewrites used to live: the code is in
:mod:`portable_guided.json_schema.xgrammar_patterns` (the refusals and string forms there read
it, and the front end imports nothing from the runtime). These names stay importable from
here."""

from __future__ import annotations

from ..json_schema.xgrammar_patterns import (
    LARGEST_JSON_REPEAT,
    MAX_ESCAPED_MIN_LENGTH,
    exact_pattern,
    largest_repeat,
    needs_escaped_character,
)

__all__ = ["LARGEST_JSON_REPEAT", "MAX_ESCAPED_MIN_LENGTH", "exact_pattern", "largest_repeat", "needs_escaped_character"]
