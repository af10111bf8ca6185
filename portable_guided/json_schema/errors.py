"""What the JSON Schema front end reports to the compile path (imports nothing)."""

from __future__ import annotations

__all__ = ["EmptyLanguage"]


class EmptyLanguage(ValueError):
    """The compiled grammar accepts no output at all (e.g. ``{"$ref": "#"}``): a request
    could produce nothing, so the compile fails instead of serving an empty mask.

    Raised by the lowering (an unsatisfiable schema) and by the engines (a grammar whose
    language is empty); importable from ``portable_guided.runtime.engines`` too."""
