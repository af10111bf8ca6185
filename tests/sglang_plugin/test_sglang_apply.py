"""The plugin's apply hooks against SGLang 0.5.23's own ``apply_vocab_mask`` per backend.

SGLang's functions are captured from the classes before the plugin is loaded (through
SGLang's own ``load_plugins()`` and the installed entry point), then both run on identical
logits and must agree exactly. The static ``XGrammarGrammarBackend.apply_vocab_mask`` raises
``Unsupported device: cpu`` upstream, so it is compared with SGLang's CPU path of the same
mask (``XGrammarGrammar.apply_vocab_mask``).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from tests.sglang_plugin.support import plugin_loaded, pristine, random_bitmask, random_logits

ORIGINAL = pristine()
DTYPES = [torch.float32, torch.bfloat16]


@pytest.fixture
def plugin(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    from portable_guided.integrations import sglang as plugin

    with plugin_loaded(monkeypatch):
        yield plugin


def _current() -> dict[str, Any]:
    from sglang.srt.constrained.llguidance_backend import GuidanceGrammar
    from sglang.srt.constrained.xgrammar_backend import XGrammarGrammar, XGrammarGrammarBackend

    return {"xgrammar": lambda **kw: XGrammarGrammar.apply_vocab_mask(None, **kw),
            "xgrammar_static": XGrammarGrammarBackend.apply_vocab_mask,
            "llguidance": GuidanceGrammar.apply_vocab_mask}


def _theirs(hook: str, logits: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    out = logits.clone()
    if hook == "xgrammar_static" or hook == "xgrammar":  # upstream raises on CPU; its mask format is xgrammar's
        ORIGINAL["xgrammar"](None, logits=out, vocab_mask=mask)
    else:
        ORIGINAL["llguidance"](logits=out, vocab_mask=mask)
    return out


def _cases() -> list[tuple[str, int, int, int, float]]:
    # (name, rows, vocab of the logits, mask words, fraction blocked)
    return [
        ("99pct_blocked", 8, 4096, 128, 0.99),
        ("half_blocked", 5, 1000, 32, 0.5),   # vocab not a multiple of 32: mask wider
        ("all_allowed", 4, 2048, 64, 0.0),
        ("all_blocked", 3, 512, 16, 1.0),
        ("padded_vocab", 4, 1100, 32, 0.7),   # logits wider than the mask (padding columns)
        ("one_row", 1, 640, 20, 0.9),
    ]


@pytest.mark.parametrize("dtype", DTYPES, ids=["fp32", "bf16"])
@pytest.mark.parametrize("case", _cases(), ids=lambda c: c[0])
@pytest.mark.parametrize("hook", ["xgrammar", "xgrammar_static", "llguidance"])
def test_hook_matches_sglang(plugin: Any, hook: str, case: Any, dtype: torch.dtype) -> None:
    from portable_guided.integrations.sglang import apply

    name, rows, vocab, words, blocked = case
    logits = random_logits(rows, vocab, dtype, seed=rows * vocab)
    mask = random_bitmask(rows, words, blocked, seed=vocab)
    if name == "all_allowed":
        mask.fill_(-1)
    expected = _theirs(hook, logits, mask)
    ours = logits.clone()
    with pytest.warns(UserWarning) if name == "padded_vocab" and hook != "llguidance" else \
            _nothing():
        _current()[hook](logits=ours, vocab_mask=mask)
    assert plugin.is_patched()
    assert not apply.TAKEOVERS[hook].canary.tripped, "the canary saw a difference"
    assert torch.equal(ours, expected)
    assert bool((ours == float("-inf")).any()) == (name != "all_allowed" or hook == "llguidance"
                                                   and vocab > 32 * words)
    # A second call of the same kind runs without the canary: same result.
    again = logits.clone()
    with pytest.warns(UserWarning) if name == "padded_vocab" and hook != "llguidance" else \
            _nothing():
        _current()[hook](logits=again, vocab_mask=mask)
    assert torch.equal(again, expected)


class _nothing:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


@pytest.mark.parametrize("dtype", DTYPES, ids=["fp32", "bf16"])
def test_batch_with_unconstrained_rows_through_sampling_batch_info(
        plugin: Any, dtype: torch.dtype) -> None:
    """SGLang's ``SamplingBatchInfo.update_regex_vocab_mask`` and ``GrammarMask.apply`` (the
    scheduler's code): rows without a grammar, finished and terminated rows keep the
    all-allowed value; constrained rows get their grammar's mask."""
    from sglang.srt.constrained.xgrammar_backend import XGrammarGrammar
    from sglang.srt.sampling.sampling_batch_info import SamplingBatchInfo

    vocab = 3000
    masks = random_bitmask(6, (vocab + 31) // 32, 0.95, seed=7)

    class Fake(XGrammarGrammar):  # SGLang's grammar class with a scripted matcher
        def __init__(self, row: int, done: bool = False) -> None:
            self._finished = done
            self.row = row

        def is_terminated(self) -> bool:
            return False

        def fill_vocab_mask(self, vocab_mask: torch.Tensor, idx: int) -> None:
            vocab_mask[idx] = masks[self.row]

    grammars = [Fake(0), None, Fake(2), Fake(3, done=True), None, Fake(5)]
    batch = SimpleNamespace(grammars=grammars, vocab_size=vocab, temperatures=torch.ones(6, 1),
                            device="cpu", grammar_mask=None)
    SamplingBatchInfo.update_regex_vocab_mask(batch)
    logits = random_logits(6, vocab, dtype, seed=1)
    expected = logits.clone()
    ORIGINAL["xgrammar"](None, logits=expected, vocab_mask=batch.grammar_mask.vocab_mask)
    batch.grammar_mask.apply(logits)
    assert torch.equal(logits, expected)
    for row in (1, 3, 4):  # unconstrained rows untouched
        assert not bool((logits[row] == float("-inf")).any())
    assert bool((logits[0] == float("-inf")).any())


def test_static_variant_fixes_unsupported_device_on_cpu(plugin: Any) -> None:
    """Upstream, the static xgrammar apply (the reasoner's path for rows without a grammar)
    raises on CPU logits; ours masks them like SGLang's CPU path."""
    from sglang.srt.constrained.xgrammar_backend import XGrammarGrammarBackend

    logits = random_logits(2, 256, torch.float32, seed=3)
    mask = random_bitmask(2, 8, 0.9, seed=3)
    with pytest.raises(RuntimeError, match="Unsupported device: cpu"):
        ORIGINAL["xgrammar_static"](logits=logits.clone(), vocab_mask=mask)
    ours = logits.clone()
    XGrammarGrammarBackend.apply_vocab_mask(logits=ours, vocab_mask=mask)
    assert torch.equal(ours, _theirs("xgrammar", logits, mask))


def test_reasoner_hands_out_our_apply(plugin: Any) -> None:
    """SGLang's reasoner wrapper returns its inner grammar's apply, or its backend's static
    one for rows without a grammar: both are ours once the plugin is loaded."""
    from sglang.srt.constrained.reasoner_grammar_backend import ReasonerGrammarObject
    from sglang.srt.constrained.xgrammar_backend import XGrammarGrammarBackend

    from portable_guided.integrations.sglang import apply

    wrapper = ReasonerGrammarObject(None, think_end_ids=[5],
                                    apply_vocab_mask_fn=XGrammarGrammarBackend.apply_vocab_mask)
    assert wrapper.apply_vocab_mask.__wrapped__ is ORIGINAL["xgrammar_static"]
    logits = random_logits(2, 64, torch.bfloat16, seed=4)
    mask = random_bitmask(2, 2, 0.5, seed=4)
    expected = _theirs("xgrammar", logits, mask)
    wrapper.apply_vocab_mask(logits=logits, vocab_mask=mask)
    assert torch.equal(logits, expected)
    assert apply.TAKEOVERS["xgrammar_static"].canary.checks >= 1


def test_one_info_line_and_off_switch(monkeypatch: pytest.MonkeyPatch,
                                      caplog: pytest.LogCaptureFixture) -> None:
    from portable_guided.integrations import sglang as plugin

    caplog.set_level(logging.INFO, logger="sglang.plugins.portable_guided")
    with plugin_loaded(monkeypatch):
        assert plugin.is_patched()
        assert plugin.taken_over() == {"xgrammar": "verified", "xgrammar_static": "verified",
                                       "llguidance": "verified", "outlines": "verified"}
    lines = [r.getMessage() for r in caplog.records if "takes over" in r.getMessage()]
    assert len(lines) == 1 and "0.5.23" in lines[0]
    assert not plugin.is_patched()
    assert _current()["llguidance"].__code__ is ORIGINAL["llguidance"].__code__
    caplog.clear()
    with plugin_loaded(monkeypatch, setting="0"):
        assert not plugin.is_patched() and plugin.taken_over() == {}
    assert any("disabled by PORTABLE_GUIDED_SGLANG=0" in r.getMessage() for r in caplog.records)


def test_1d_logits(plugin: Any) -> None:
    for hook in ("xgrammar", "llguidance"):
        logits = random_logits(1, 320, torch.float32, seed=9)[0]
        mask = random_bitmask(1, 10, 0.8, seed=9)[0]
        expected = _theirs(hook, logits, mask)
        ours = logits.clone()
        _current()[hook](logits=ours, vocab_mask=mask)
        assert torch.equal(ours, expected)
