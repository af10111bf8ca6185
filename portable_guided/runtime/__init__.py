"""The grammar runtime: the engine-facing half of portable_guided.

Asynchronous cached compiles with real time limits, batched mask filling, speculative
accept/rollback, reasoning phases, a fail-closed error policy and two grammar engines
(xgrammar, llguidance) behind one interface. See ``docs/runtime.md``.

Grammar engines and tokenizer libraries are imported only when first used.
"""

from __future__ import annotations

from .errors import (
    CompileWorkerLost,
    GrammarCompileError,
    GrammarEmptyLanguage,
    GrammarEngineError,
    GrammarError,
    GrammarNotReady,
    GrammarRejectedToken,
    GrammarSpecError,
    GrammarTimeout,
    RuntimeClosed,
)
from .metrics import Metrics
from .prometheus import RuntimeCollector, register_prometheus
from .request import ON_ERROR_POLICIES, ReasoningConfig, Request, RequestContext
from .rows import SpecialRows
from .runtime import GrammarRuntime
from .specs import GrammarSpec
from .tokenizer_info import TiktokenVocab, TokenizerInfo, load_tiktoken_ranks, load_tokenizer_info

__all__ = [
    "ON_ERROR_POLICIES",
    "CompileWorkerLost",
    "GrammarCompileError",
    "GrammarEmptyLanguage",
    "GrammarEngineError",
    "GrammarError",
    "GrammarNotReady",
    "GrammarRejectedToken",
    "GrammarRuntime",
    "GrammarSpec",
    "GrammarSpecError",
    "GrammarTimeout",
    "Metrics",
    "ReasoningConfig",
    "Request",
    "RequestContext",
    "RuntimeClosed",
    "RuntimeCollector",
    "SpecialRows",
    "TiktokenVocab",
    "TokenizerInfo",
    "load_tiktoken_ranks",
    "load_tokenizer_info",
    "register_prometheus",
]
