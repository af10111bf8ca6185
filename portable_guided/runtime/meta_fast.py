"""Where the quick meta-schema proof used to live: the code is in
:mod:`portable_guided.json_schema.meta_fast`. Its name stays importable from here."""

from __future__ import annotations

from ..json_schema.meta_fast import proves_valid

__all__ = ["proves_valid"]
