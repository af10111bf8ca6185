"""The Outlines hook against SGLang 0.5.23's own ``OutlinesGrammar.apply_vocab_mask`` (one
``masked_fill_`` of a bool mask, True = blocked): the hook packs the mask into words on the
CPU and applies it through ``apply_token_mask``; the results must be identical. Then SGLang's
outlines backend end to end: a real ``RegexGuide`` on a real tokenizer fills the batch's mask
through the scheduler's ``update_regex_vocab_mask`` and ``GrammarMask.apply``."""

from __future__ import annotations

from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from tests.sglang_plugin.support import plugin_loaded, pristine, random_logits

pytest.importorskip("outlines.fsm.guide", reason="SGLang's outlines backend needs outlines 0.1.x")

ORIGINAL = pristine()
DTYPES = [torch.float32, torch.bfloat16]
# (name, rows, vocab, fraction blocked)
CASES = [("99pct_blocked", 8, 4096, 0.99), ("half_blocked", 5, 1001, 0.5),
         ("all_allowed", 4, 2048, 0.0), ("all_blocked", 3, 512, 1.0), ("one_row", 1, 640, 0.9),
         ("vocab_of_7", 2, 7, 0.5)]


@pytest.fixture
def plugin(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    from portable_guided.integrations import sglang as plugin

    with plugin_loaded(monkeypatch):
        yield plugin


def _blocked(rows: int, vocab: int, share: float, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.rand(rows, vocab, generator=g) < share


def _theirs(logits: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    out = logits.clone()
    ORIGINAL["outlines"](logits=out, vocab_mask=mask)
    return out


@pytest.mark.parametrize("dtype", DTYPES, ids=["fp32", "bf16"])
@pytest.mark.parametrize("case", CASES, ids=lambda c: c[0])
def test_outlines_hook_matches_sglang(plugin: Any, case: Any, dtype: torch.dtype) -> None:
    from sglang.srt.constrained.outlines_backend import OutlinesGrammar

    from portable_guided.integrations.sglang import apply

    _, rows, vocab, share = case
    logits = random_logits(rows, vocab, dtype, seed=rows * vocab)
    mask = _blocked(rows, vocab, share, seed=vocab)
    expected = _theirs(logits, mask)
    for _ in range(2):  # the first call of a kind runs beside the canary, the second alone
        ours = logits.clone()
        OutlinesGrammar.apply_vocab_mask(logits=ours, vocab_mask=mask)
        assert torch.equal(ours, expected)
    assert plugin.taken_over()["outlines"] == "verified"
    takeover = apply.TAKEOVERS["outlines"]
    assert takeover.canary.checks >= 1 and not takeover.canary.tripped
    assert int((expected == float("-inf")).sum()) == int(mask.sum())  # (the reference masks)


def test_outlines_words_are_the_allowed_bits() -> None:
    from portable_guided.integrations.sglang.apply import outlines_words

    mask = _blocked(3, 77, 0.6, seed=5)
    words = outlines_words(mask)
    assert words.dtype == torch.int32 and words.shape == (3, 3)
    for r in range(3):
        for t in range(77):
            bit = (int(words[r, t // 32]) >> (t % 32)) & 1
            assert bit == (0 if mask[r, t] else 1), (r, t)


def test_outlines_other_shapes_keep_masked_fill(plugin: Any) -> None:
    """A 1-D row, a mask broadcast over the batch, a column slice of wider logits: SGLang's
    ``masked_fill_`` semantics, whichever path runs."""
    from sglang.srt.constrained.outlines_backend import OutlinesGrammar

    wide = random_logits(4, 300, torch.float32, seed=8)
    for logits, mask in ((wide[0], _blocked(1, 300, 0.7, seed=1)[0]),
                         (wide, _blocked(1, 300, 0.7, seed=2)),
                         (wide[:, :200], _blocked(4, 200, 0.7, seed=3))):
        expected = _theirs(logits, mask)
        ours = logits.clone()
        OutlinesGrammar.apply_vocab_mask(logits=ours, vocab_mask=mask)
        assert torch.equal(ours, expected)


@pytest.mark.parametrize("dtype", DTYPES, ids=["fp32", "bf16"])
def test_outlines_backend_batch_through_the_scheduler_code(plugin: Any,
                                                           dtype: torch.dtype) -> None:
    """SGLang's outlines backend compiles a regex into a real ``RegexGuide`` on SmolLM2's
    tokenizer; ``update_regex_vocab_mask`` fills the batch (rows without a grammar stay
    allowed) and ``GrammarMask.apply`` masks the logits: the same logits as SGLang's own
    apply of the same mask, and exactly the guide's allowed tokens survive."""
    from outlines.caching import cache_disabled
    from sglang.srt.constrained.outlines_backend import OutlinesGrammar, OutlinesGrammarBackend
    from sglang.srt.sampling.sampling_batch_info import SamplingBatchInfo

    from portable_guided.runtime import load_tokenizer_info

    tokenizer = load_tokenizer_info("smollm2").hf_tokenizer
    backend = OutlinesGrammarBackend(tokenizer, whitespace_pattern=None)
    # (Outlines' disk cache keys by a hash of the tokenizer from `datasets`, not installed.)
    with cache_disabled():
        first = backend.dispatch_regex(r"[0-9]{3}-[a-z]+")
        second = backend.dispatch_json(
            '{"type": "object", "properties": {"a": {"type": "integer"}}}')
    assert isinstance(first, OutlinesGrammar) and isinstance(second, OutlinesGrammar)
    first.accept_token(tokenizer.convert_tokens_to_ids("1"))
    vocab = len(tokenizer)
    batch = SimpleNamespace(grammars=[first, None, second], vocab_size=vocab,
                            temperatures=torch.ones(3, 1), device="cpu", grammar_mask=None)
    SamplingBatchInfo.update_regex_vocab_mask(batch)
    logits = random_logits(3, vocab, dtype, seed=11)
    expected = _theirs(logits, batch.grammar_mask.vocab_mask)
    batch.grammar_mask.apply(logits)
    assert torch.equal(logits, expected)
    for row, grammar in ((0, first), (2, second)):
        allowed = set(grammar.guide.get_next_instruction(grammar.state).tokens.tolist())
        survived = set(torch.nonzero(logits[row] != float("-inf")).flatten().tolist())
        assert survived == allowed and 0 < len(allowed) < vocab
    assert not bool((logits[1] == float("-inf")).any())
