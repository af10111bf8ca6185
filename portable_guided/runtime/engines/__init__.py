"""Grammar engines behind one strategy interface (engine strategy x device platform).

Engines are looked up by name; their modules (and the engine libraries) are imported only
when an engine is first used. Everything engine-specific lives in the engine's module: the
compile and fill calls, and the conversion of a
:class:`~portable_guided.runtime.TokenizerInfo` into the library's tokenizer object and into
the payload a compile worker rebuilds it from. Callers go through :class:`Engine`
(``engine_class(name).tokenizer_payload(info)``, ``.from_payload(payload)``,
``.create(info)``) and never branch on an engine's name.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from .base import EmptyLanguage, Engine, Matcher, UnsupportedSpec, compile_checked

if TYPE_CHECKING:
    from ..tokenizer_info import TokenizerInfo

__all__ = [
    "DEFAULT_ENGINE",
    "ENGINES",
    "EmptyLanguage",
    "Engine",
    "Matcher",
    "UnsupportedSpec",
    "compile_checked",
    "create_engine",
    "engine_class",
]

#: The engine choice of :class:`~portable_guided.runtime.GrammarRuntime` and of every serving
#: engine's backend when none is named: chosen by measurement (docs/latency.md, "Choosing an
#: engine"; bench/bench_engine_choice.py).
DEFAULT_ENGINE = "auto"

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


def create_engine(name: str, info: TokenizerInfo, *, fill_threads: int = 1) -> Engine:
    """The engine ``name`` for tokenizer ``info`` in this process."""
    return engine_class(name).create(info, fill_threads=fill_threads)
