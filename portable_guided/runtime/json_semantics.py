"""Where the engines' reading of JSON Schema used to live: the code is in
:mod:`portable_guided.json_schema` (``refusals`` for what each engine would read differently,
``numbers`` for number ranges, ``strict`` for the strict variants, ``xgrammar_forms`` for the
string forms xgrammar builds exactly, ``walk`` for :func:`map_schemas`). These names stay
importable from here."""

from __future__ import annotations

# Re-exported (other modules and tests import them from here).
from ..json_schema.keywords import ANNOTATIONS  # noqa: F401
from ..json_schema.numbers import llguidance_exact_numbers, plain_number_range
from ..json_schema.refusals import (
    _FORMAT_PATTERNS,  # noqa: F401
    _REFUSING,  # noqa: F401
    XGRAMMAR_IGNORED,  # noqa: F401
    XGRAMMAR_TYPED_ONLY,  # noqa: F401
    format_unsupported,
    llguidance_unsupported,
    xgrammar_unsupported,
)
from ..json_schema.strict import strict_schema, xgrammar_open_schema, xgrammar_strict_schema
from ..json_schema.walk import (
    iter_schemas,  # noqa: F401
    map_schemas,
    node_patterns,
)
from ..json_schema.xgrammar_forms import length_pattern, xgrammar_exact_strings

__all__ = ["format_unsupported", "length_pattern", "llguidance_exact_numbers",
           "llguidance_unsupported", "map_schemas", "plain_number_range",
           "node_patterns", "strict_schema", "xgrammar_exact_strings", "xgrammar_open_schema", "xgrammar_strict_schema",
           "xgrammar_unsupported"]
