"""Grammar engines behind one strategy interface (engine strategy x device platform).

Engines are looked up by name; their modules (and the engine libraries) are imported only
when an engine is first used.
"""

from __future__ import annotations

import importlib
from typing import Any

from .base import Engine, Matcher, UnsupportedSpec

__all__ = ["ENGINES", "Engine", "Matcher", "UnsupportedSpec", "create_engine", "engine_class"]

#: Engine name -> (module, class, pip package that provides the library).
ENGINES: dict[str, tuple[str, str, str]] = {
    "xgrammar": ("portable_guided.runtime.engines.xgrammar", "XGrammarEngine", "xgrammar"),
    "llguidance": ("portable_guided.runtime.engines.llguidance", "LLGuidanceEngine", "llguidance"),
}


def engine_class(name: str) -> type[Engine]:
    """The engine class registered as ``name``; ImportError with an install hint if the
    engine's library is missing."""
    try:
        module, cls, package = ENGINES[name]
    except KeyError:
        raise ValueError(f"unknown grammar engine {name!r}; available: {sorted(ENGINES)}") from None
    try:
        return getattr(importlib.import_module(module), cls)
    except ImportError as exc:
        raise ImportError(f"the {name} engine needs `pip install {package}`: {exc}") from exc


def create_engine(name: str, info: Any, *, fill_threads: int = 1) -> Engine:
    """An engine for tokenizer ``info`` (a :class:`TokenizerInfo`) in this process."""
    cls = engine_class(name)
    native = info.xgrammar() if name == "xgrammar" else info.llguidance()
    return cls(native, fill_threads=fill_threads)  # type: ignore[call-arg]
