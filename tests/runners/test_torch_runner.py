"""The PyTorch runner against ``transformers``' own forward and ``generate``."""

from __future__ import annotations

import numpy as np
import pytest

from portable_guided.decode.device import SamplingParams
from portable_guided.decode.engine import GenerationRequest, Generator
from tests.support import padded_rows

pytestmark = [pytest.mark.torch, pytest.mark.model]

PROMPTS = ["Hello, my name is", "The capital of France is", "List three colors:", "def fib(n):"]


def test_ragged_prefill_and_cached_decode_match_transformers(torch_runner, tokenizer):
    import torch

    from portable_guided.runners.weights import load_hf_model

    hf = load_hf_model()
    rows = [tokenizer(p)["input_ids"] for p in PROMPTS]
    torch_runner.reset(8, 64)
    slots = [5, 1, 7, 0]  # any slot order
    ids, counts = padded_rows(rows)
    got = torch_runner.forward(slots, ids, counts, all_positions=True)
    extra = [11, 22, 33, 44]
    step = torch_runner.forward(slots, torch.tensor(extra))
    offset = 0
    with torch.inference_mode():
        for i, r in enumerate(rows):
            ref = hf(torch.tensor([r + [extra[i]]])).logits[0]
            torch.testing.assert_close(got[offset : offset + len(r)], ref[:-1], atol=5e-4, rtol=0)
            torch.testing.assert_close(step[i], ref[-1], atol=5e-4, rtol=0)
            offset += len(r)
    assert [torch_runner.length(s) for s in slots] == [c + 1 for c in counts]


def test_truncate_rolls_back_the_cache(torch_runner, tokenizer):
    import torch

    row = tokenizer("One two three four")["input_ids"]
    torch_runner.reset(2, 32)
    ref = torch_runner.forward([0], np.array([row]))
    torch_runner.forward([0], torch.tensor([999]))
    torch_runner.truncate(0, len(row) - 1)
    again = torch_runner.forward([0], torch.tensor([row[-1]]))
    torch.testing.assert_close(again, ref, atol=1e-4, rtol=0)
    with pytest.raises(ValueError, match="cannot truncate slot 0 of length"):
        torch_runner.truncate(0, 99)


@pytest.mark.parametrize("overlap", [True, False])
def test_batched_greedy_generation_equals_transformers_generate(torch_runner, tokenizer, overlap):
    import torch

    from portable_guided.runners.weights import load_hf_model

    hf = load_hf_model()
    rows = [tokenizer(p)["input_ids"] for p in PROMPTS]
    # max_batch 3 < 4 requests: the last one joins when a slot frees up.
    gen = Generator(torch_runner, overlap=overlap, max_batch=3)
    outs = gen.generate([GenerationRequest(r, max_tokens=10) for r in rows])
    with torch.inference_mode():
        for r, out in zip(rows, outs):
            ref = hf.generate(torch.tensor([r]), max_new_tokens=10, do_sample=False)[0, len(r):]
            ref = [t for t in ref.tolist() if t != torch_runner.eos_token_id]
            assert out.token_ids == ref[: len(out.token_ids)]
            assert out.finish_reason in ("length", "stop")
            assert len(out.token_ids) == 10 or out.finish_reason == "stop"


def test_sampling_is_seeded_and_differs_from_greedy(torch_runner, tokenizer):
    rows = [tokenizer(p)["input_ids"] for p in PROMPTS[:2]]
    reqs = [GenerationRequest(r, max_tokens=12) for r in rows]

    def run(params: SamplingParams) -> list[list[int]]:
        return [o.token_ids for o in Generator(torch_runner, sampling=params).generate(reqs)]

    hot = SamplingParams(temperature=1.5, seed=7)
    assert run(hot) == run(hot)
    assert run(hot) != run(SamplingParams())
    assert run(SamplingParams(temperature=1.0, top_p=1e-6, seed=3)) == run(SamplingParams())


def test_forward_rejects_bad_input(torch_runner):
    torch_runner.reset(2, 8)
    with pytest.raises(ValueError, match="2 slots for 1 token rows"):
        torch_runner.forward([0, 1], np.zeros((1, 3), dtype=np.int64))
    with pytest.raises(ValueError, match="exceeds the cache's 8"):
        torch_runner.forward([0], np.zeros((1, 9), dtype=np.int64))
    with pytest.raises(ValueError, match="must be 2-D"):
        torch_runner.forward([0], np.zeros(3, dtype=np.int64))


def test_overlap_defaults_off_when_the_forward_runs_on_the_cpu(torch_runner):
    # On the CPU the fill would compete with the forward for the same cores (see docs).
    assert Generator(torch_runner).overlap is False
    assert Generator(torch_runner, overlap=True).overlap is True
