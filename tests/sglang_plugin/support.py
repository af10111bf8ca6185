"""Shared helpers for the sglang-cpu lane: SGLang's own functions captured before any patch,
the plugin loaded through SGLang's ``load_plugins()``, and random masks."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch

XGR = "sglang.srt.constrained.xgrammar_backend"
LLG = "sglang.srt.constrained.llguidance_backend"


def pristine() -> dict[str, Any]:
    """SGLang's own apply functions, read from the classes (call before loading plugins)."""
    from sglang.srt.constrained.llguidance_backend import GuidanceGrammar
    from sglang.srt.constrained.xgrammar_backend import XGrammarGrammar, XGrammarGrammarBackend

    def raw(cls: type, name: str) -> Any:
        value = cls.__dict__[name]
        value = getattr(value, "__func__", value)
        return getattr(value, "__wrapped__", value)

    out = {
        "xgrammar": raw(XGrammarGrammar, "apply_vocab_mask"),
        "xgrammar_static": raw(XGrammarGrammarBackend, "apply_vocab_mask"),
        "llguidance": raw(GuidanceGrammar, "apply_vocab_mask"),
    }
    try:  # (outlines 0.1.x: in the sglang-cpu lane)
        from sglang.srt.constrained.outlines_backend import OutlinesGrammar
    except ImportError:
        return out
    out["outlines"] = raw(OutlinesGrammar, "apply_vocab_mask")
    return out


@contextmanager
def plugin_loaded(monkeypatch: Any, setting: str = "1") -> Iterator[None]:
    """SGLang's ``load_plugins()`` with only our entry point, then everything restored."""
    from sglang.srt import plugins
    from sglang.srt.plugins.hook_registry import HookRegistry

    from portable_guided.integrations import sglang as plugin

    monkeypatch.setenv("PORTABLE_GUIDED_SGLANG", setting)
    monkeypatch.setenv("SGLANG_PLUGINS", "portable_guided")
    monkeypatch.setattr(plugins, "_plugins_loaded", False)
    try:
        plugins.load_plugins()
        yield
    finally:
        plugin.unpatch()
        HookRegistry.reset()


def random_bitmask(rows: int, words: int, blocked: float, seed: int) -> torch.Tensor:
    """int32 words with about ``blocked`` of the bits cleared."""
    g = torch.Generator().manual_seed(seed)
    bits = torch.rand(rows, words * 32, generator=g) >= blocked
    weights = (1 << torch.arange(32, dtype=torch.int64))
    words64 = (bits.view(rows, words, 32).to(torch.int64) * weights).sum(-1)
    return ((words64 + 2**31) % 2**32 - 2**31).to(torch.int32)  # wrap to signed words


def random_logits(rows: int, vocab: int, dtype: torch.dtype, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(rows, vocab, generator=g).to(dtype)
