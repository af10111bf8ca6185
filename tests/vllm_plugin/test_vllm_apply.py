"""Our ``apply_grammar_bitmask`` against vLLM 0.32's own, on the same inputs.

The scheduler's rows come in the order of ``structured_output_request_ids``, one per
request plus one per scheduled speculative token; the model runner's batch has its own
order, requests without a grammar, and structured requests the scheduler listed but the
batch does not hold. Both implementations must leave exactly the same logits.
"""

from __future__ import annotations

import random
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from vllm.v1.core.sched.output import GrammarOutput
from vllm.v1.structured_output import utils as vllm_utils

from portable_guided.integrations.vllm.apply import apply_grammar_bitmask, grammar_rows

VOCAB = 49_152


def random_step(rng: random.Random, vocab: int, spec: bool):
    n_batch = rng.randint(1, 12)
    batch = [f"r{i}" for i in range(n_batch)]
    rng.shuffle(batch)
    structured = [r for r in batch if rng.random() < 0.7]
    if rng.random() < 0.3:
        structured.append("gone")  # listed by the scheduler, no longer in the batch
    rng.shuffle(structured)
    spec_tokens = {r: [rng.randrange(vocab) for _ in range(rng.randint(0, 3))]
                   for r in batch if spec and rng.random() < 0.6}
    n_rows = sum(1 + len(spec_tokens.get(r, ())) for r in structured)
    words = (vocab + 31) // 32
    # JSON-like rows (a few allowed tokens) and dense random rows.
    bitmask = np.zeros((n_rows, words), dtype=np.int32)
    for row in bitmask:
        if rng.random() < 0.5:
            row[:] = np.random.default_rng(rng.randrange(1 << 30)).integers(
                -(1 << 31), 1 << 31, words, dtype=np.int64).astype(np.int32)
        else:
            for t in rng.sample(range(vocab), 40):
                row[t // 32] |= np.int32(np.uint32(1 << (t % 32)).view(np.int32))
    n_logits = n_batch + sum(len(v) for v in spec_tokens.values())
    return batch, structured, spec_tokens, bitmask, n_logits


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("spec", [False, True])
def test_same_logits_as_vllm(dtype, spec):
    rng = random.Random(hash((str(dtype), spec)) & 0xFFFF)
    for _ in range(25):
        batch, structured, spec_tokens, bitmask, n_logits = random_step(rng, VOCAB, spec)
        scheduler_output = SimpleNamespace(scheduled_spec_decode_tokens=spec_tokens)
        grammar_output = GrammarOutput(structured, bitmask, [0] * len(structured))
        input_batch = SimpleNamespace(req_ids=batch)
        logits = torch.randn(n_logits, VOCAB).to(dtype)
        theirs, ours = logits.clone(), logits.clone()
        vllm_utils.apply_grammar_bitmask(scheduler_output, grammar_output, input_batch, theirs)
        apply_grammar_bitmask(scheduler_output, grammar_output, input_batch, ours)
        assert torch.equal(ours, theirs)
        # Rows without a grammar are untouched, bit for bit.
        _, logits_rows = grammar_rows(batch, structured, spec_tokens)
        free = sorted(set(range(n_logits)) - set(logits_rows))
        assert torch.equal(ours[free], logits[free])


def test_grammar_rows_exact():
    # Batch order a, b, c; the scheduler lists c then a; a has two draft tokens.
    assert grammar_rows(["a", "b", "c"], ["c", "a"], {"a": [5, 6]}) == ([0, 1, 2, 3], [4, 0, 1, 2])
    # b is not structured but has a draft: it shifts c's logits row.
    assert grammar_rows(["a", "b", "c"], ["c"], {"b": [1]}) == ([0], [3])
    # A request the batch no longer holds keeps its bitmask rows but maps nowhere.
    assert grammar_rows(["a"], ["x", "a"], {"x": [1, 2]}) == ([3], [0])
    assert grammar_rows([], [], {}) == ([], [])


def test_all_rows_constrained_in_order_passes_no_indices(monkeypatch):
    """The common decode step (every row constrained, in batch order) needs no gather."""
    import portable_guided.integrations.vllm.apply as apply_mod

    seen = {}

    def spy(logits, bitmask, indices=None, **kw):
        seen["indices"], seen["rows"] = indices, bitmask.shape[0]
        return logits

    monkeypatch.setattr(apply_mod, "apply_token_mask", spy)
    bitmask = np.zeros((3, VOCAB // 32), np.int32)
    apply_grammar_bitmask(SimpleNamespace(scheduled_spec_decode_tokens={}),
                          GrammarOutput(["a", "b", "c"], bitmask, [0, 0, 0]),
                          SimpleNamespace(req_ids=["a", "b", "c"]), torch.zeros(3, VOCAB))
    assert seen == {"indices": None, "rows": 3}
