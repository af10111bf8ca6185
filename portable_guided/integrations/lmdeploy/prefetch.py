"""Compiles submitted at admission where lmdeploy's model agents run in other processes.

With lmdeploy's ``mp`` and ``ray`` executors (tensor parallelism) each rank's model agent,
and so its ``GuidedDecodingManager`` and our runtime, lives in a worker process: the engine's
process admits a request but holds no manager to hand its grammar to. There, the engine's
process compiles each admitted request's grammar itself, into a cache the agents' runtimes
share: the disk cache at ``PORTABLE_GUIDED_LMDEPLOY_CACHE_DIR`` (one host) or the fleet cache
at ``PORTABLE_GUIDED_CACHE_URL`` (ranks on several hosts). By a request's first sampling step
its grammar is there, or being made (a runtime that misses waits on the cache's lock for the
process compiling it, then reads it). With neither set nothing is prefetched: the ranks
compile at the first sampling step, as before.

The engine's process builds the same runtime as an agent does (the backend's ``_runtime_for``:
the same tokenizer, vocabulary size and settings, so the same cache keys), in a thread of
its own: the event loop only hands the format over.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from types import SimpleNamespace
from typing import Any

__all__ = ["CACHE_DIR_ENV", "Prefetch", "engine_tokenizer", "manager_vocab_size"]

logger = logging.getLogger("lmdeploy.plugins.portable_guided")

#: The disk cache the engine's processes share; prefetching needs it.
CACHE_DIR_ENV = "PORTABLE_GUIDED_LMDEPLOY_CACHE_DIR"


def engine_tokenizer(model_config: Any) -> Any:
    """The tokenizer a model agent builds (``Tokenizer(model_path).model.model``), from the
    model path in the engine's model config."""
    from lmdeploy.tokenizer import Tokenizer

    hf_config = model_config.hf_config
    path = getattr(hf_config, "name_or_path", None) or getattr(hf_config, "_name_or_path", None)
    if not path:
        raise RuntimeError("lmdeploy's model config names no model path")
    # A model with remote code (auto_map) was loaded by the agents with it trusted.
    return Tokenizer(path, trust_remote_code=bool(getattr(hf_config, "auto_map", None))
                     ).model.model


def manager_vocab_size(tokenizer: Any, vocab_size: int | None) -> int:
    """The vocabulary size ``GuidedDecodingManager`` settles on (the model's, widened to the
    tokenizer's length): part of the runtime's cache keys, so it must be the agents'."""
    if vocab_size is None:
        vocab_size = tokenizer.vocab_size
    return max(int(vocab_size), len(tokenizer))


class Prefetch:
    """One engine process's compiles at admission (see the module doc). ``runtime_for`` and
    ``spec_for`` are the backend's (``_runtime_for``, ``spec_for``):
    the runtime a rank builds, and the spec of a format."""

    def __init__(self, model_config: Any, runtime_for: Callable[[Any, Any], Any],
                 spec_for: Callable[[Mapping[str, Any]], Any]) -> None:
        self._spec_for = spec_for
        self._jobs = ThreadPoolExecutor(1, thread_name_prefix="pg-lmdeploy-prefetch")
        self._runtime: Future[Any] = self._jobs.submit(self._build, model_config, runtime_for)
        self._disabled = False

    @staticmethod
    def wanted(engine: Any) -> bool:
        """Whether ``engine``'s model agents are elsewhere and a cache they share is set
        (the disk directory, or the runtime's fleet cache for ranks on other hosts)."""
        from ...runtime.cache_setup import URL_ENV

        executor = getattr(engine, "executor", None)
        return (executor is not None and getattr(executor, "model_agent", None) is None
                and bool(os.environ.get(CACHE_DIR_ENV) or os.environ.get(URL_ENV)))

    @staticmethod
    def _build(model_config: Any, runtime_for: Callable[[Any, Any], Any]) -> Any:
        tokenizer = engine_tokenizer(model_config)
        manager = SimpleNamespace(vocab_size=manager_vocab_size(
            tokenizer, getattr(model_config, "vocab_size", None)))
        return runtime_for(manager, tokenizer)

    def submit(self, response_format: Mapping[str, Any]) -> None:
        """Compile ``response_format``'s grammar in the background (returns at once)."""
        if not self._disabled:
            self._jobs.submit(self._compile, dict(response_format))

    def _compile(self, response_format: dict[str, Any]) -> None:
        try:
            runtime = self._runtime.result()
        except Exception as exc:  # noqa: BLE001 - the ranks compile at their first step
            if not self._disabled:
                self._disabled = True
                logger.warning("portable_guided cannot compile at admission in the engine's "
                               "process (%s: %s); the ranks compile at the first sampling "
                               "step", type(exc).__name__, exc)
            return
        try:
            runtime.compile_async(self._spec_for(response_format))
        except Exception as exc:  # noqa: BLE001 - the request's rank reports a bad format
            logger.info("portable_guided did not prefetch a format (%s: %s)",
                        type(exc).__name__, exc)

    def drain(self, timeout_s: float | None = None) -> None:
        """Wait until every format submitted so far was handed to the runtime."""
        self._jobs.submit(lambda: None).result(timeout_s)

    @property
    def runtime(self) -> Any:
        """The engine process's runtime (waits for it to be built)."""
        return self._runtime.result()

    def close(self) -> None:
        """Stop the thread and the runtime's workers."""
        self._jobs.shutdown(wait=True, cancel_futures=True)
        if self._runtime.done() and self._runtime.exception() is None:
            self._runtime.result().close()
