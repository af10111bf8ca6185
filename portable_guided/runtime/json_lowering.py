"""Where the JSON Schema lowering used to live: the code is in :mod:`portable_guided.json_schema`
(``lowering`` for the rewrites, ``references`` for ``$ref`` resolution, ``algebra`` for merge,
negation and disjointness, ``refusals`` for :func:`unsound` and :func:`xgrammar_escapes`,
``xgrammar_forms`` for ``structured_values_text``). These names stay importable from here."""

from __future__ import annotations

# Re-exported (other modules and tests import them from here).
from ..json_schema.algebra import (
    MAX_BRANCHES,  # noqa: F401
    _NotExact,  # noqa: F401
    disjoint,  # noqa: F401
    merge,  # noqa: F401
    merge_type,  # noqa: F401
    negate,  # noqa: F401
    value_types,
)
from ..json_schema.lowering import (
    DATE_PATTERN,  # noqa: F401
    STANDARD_FORMATS,  # noqa: F401
    _lower_owned,  # noqa: F401
    _Lowerer,  # noqa: F401
    engine_schema_text,
    lower,
    needs_lowering,  # noqa: F401
    refuse_unsatisfiable,
)
from ..json_schema.references import _hoist_refs  # noqa: F401
from ..json_schema.refusals import unsound, xgrammar_escapes
from ..json_schema.walk import _KeyHint  # noqa: F401
from ..json_schema.xgrammar_forms import structured_values_text  # noqa: F401

__all__ = ["engine_schema_text", "lower", "refuse_unsatisfiable", "unsound", "value_types",
           "xgrammar_escapes"]
