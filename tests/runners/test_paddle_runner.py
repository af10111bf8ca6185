"""The Paddle forward against the PyTorch runner on the same weights and prompts.

Tolerance: absolute 1e-3 on logits whose magnitude reaches ~30 (both run float32; the observed
maximum difference is ~1e-4, from different matmul blocking in MKL/oneDNN).
"""

from __future__ import annotations

import numpy as np
import pytest

from portable_guided.decode.engine import GenerationRequest, Generator
from tests.support import padded_rows

pytestmark = [pytest.mark.paddle, pytest.mark.torch, pytest.mark.model]

LOGITS_ATOL = 1e-3
PROMPTS = ["Hello, my name is", "The capital of France is a city called", "{\"a\": [1, 2,"]


def test_logits_match_torch_runner(torch_runner, paddle_runner, tokenizer):
    import paddle
    import torch

    rows = [tokenizer(p)["input_ids"] for p in PROMPTS]
    ids, counts = padded_rows(rows)
    for r in (torch_runner, paddle_runner):
        r.reset(4, 64)
    slots = [2, 0, 3]
    ref = torch_runner.forward(slots, ids, counts, all_positions=True).numpy()
    got = paddle_runner.forward(slots, ids, counts, all_positions=True).numpy()
    assert got.shape == ref.shape == (sum(counts), 49152)
    np.testing.assert_allclose(got, ref, rtol=0, atol=LOGITS_ATOL)
    # One cached decode step, tokens given as device tensors.
    nxt = [17, 4, 902]
    ref = torch_runner.forward(slots, torch.tensor(nxt)).numpy()
    got = paddle_runner.forward(slots, paddle.to_tensor(nxt)).numpy()
    np.testing.assert_allclose(got, ref, rtol=0, atol=LOGITS_ATOL)
    assert (got.argmax(-1) == ref.argmax(-1)).all()


def test_greedy_generation_matches_torch_runner(torch_runner, paddle_runner, tokenizer):
    reqs = [GenerationRequest(tokenizer(p)["input_ids"], max_tokens=12) for p in PROMPTS]
    ref = Generator(torch_runner, max_batch=2).generate(reqs)
    got = Generator(paddle_runner, max_batch=2).generate(reqs)
    assert [o.token_ids for o in got] == [o.token_ids for o in ref]


def test_sampling_is_seeded(paddle_runner, tokenizer):
    from portable_guided.decode.device import SamplingParams

    reqs = [GenerationRequest(tokenizer(p)["input_ids"], max_tokens=8) for p in PROMPTS[:2]]
    hot = SamplingParams(temperature=1.5, seed=11)
    a = Generator(paddle_runner, sampling=hot).generate(reqs)
    b = Generator(paddle_runner, sampling=hot).generate(reqs)
    greedy = Generator(paddle_runner).generate(reqs)
    assert [o.token_ids for o in a] == [o.token_ids for o in b]
    assert [o.token_ids for o in a] != [o.token_ids for o in greedy]
