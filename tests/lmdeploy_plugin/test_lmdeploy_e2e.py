"""Greedy decoding with the real SmolLM2-135M-Instruct through lmdeploy's real
``GuidedDecodingManager`` and ``FusedLogitsProcessor``, as lmdeploy's model agent drives them
each step (``async_sampling_logits``: a new processor, masked scores, greedy sampling,
accept): lmdeploy alone, with our apply, and with our runtime backend give the same tokens,
and the text is valid JSON for its schema.

What is not lmdeploy here: the forward pass (transformers runs the model: lmdeploy's own
engine needs CUDA) and ``FusedLogitsProcessor._wait_stream_once``, a CUDA stream query,
replaced by a no-op coroutine."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import jsonschema
import pytest
import torch

from tests.lmdeploy_plugin.support import model, plugin_loaded, plugin_off, tokenizer

VOCAB = 49152
MAX_NEW = 48
CASES = [
    ("Describe a person named Ann who is 31, as JSON:",
     {"type": "object", "properties": {"name": {"type": "string", "maxLength": 12},
                                       "age": {"type": "integer"}},
      "required": ["name", "age"], "additionalProperties": False}),
    ("List three colours as JSON:",
     {"type": "object", "properties": {"colours": {
         "type": "array", "items": {"enum": ["red", "green", "blue"]},
         "minItems": 1, "maxItems": 3}},
      "required": ["colours"], "additionalProperties": False}),
]


async def _no_wait(self: Any) -> None:  # the CUDA-only stream wait
    return None


def decode(manager: Any, prompt: str, schema: dict, session: int) -> list[int]:
    from lmdeploy.pytorch.engine.logits_process import FusedLogitsProcessor, SamplingInputs

    tok, lm = tokenizer(), model()
    ids = tok(prompt, return_tensors="pt").input_ids
    fmt = {"type": "json_schema", "json_schema": {"name": "s", "schema": schema}}
    inputs = SamplingInputs(max_top_k=1, max_num_logprobs=-1, batch_size=1,
                            logits_processors=[[]], response_formats=(fmt,),
                            session_ctx=[{"session_id": session, "seq_id": 0}])
    out: list[int] = []
    past = None
    with torch.inference_mode():
        for _ in range(MAX_NEW):
            result = lm(input_ids=ids, past_key_values=past, use_cache=True)
            past = result.past_key_values
            logits = result.logits[:, -1, :].float().clone()

            async def sample(logits: torch.Tensor = logits) -> int:
                processor = FusedLogitsProcessor(inputs, guided_decoding_manager=manager)
                scores, _ = await processor(logits)
                token = processor.sampling(scores)
                await processor.accept_guided_tokens(token)
                return int(token[0])

            token = asyncio.run(sample())
            out.append(token)
            if token == tok.eos_token_id:
                break
            ids = torch.tensor([[token]])
    manager.remove_processor(session)
    return out


def decode_all(manager: Any) -> list[list[int]]:
    return [decode(manager, prompt, schema, 100 + i) for i, (prompt, schema) in
            enumerate(CASES)]


@pytest.mark.model
@pytest.mark.slow
def test_greedy_tokens_identical_plugin_on_and_off(monkeypatch: pytest.MonkeyPatch) -> None:
    from lmdeploy.pytorch.engine.guided_process import GuidedDecodingManager
    from lmdeploy.pytorch.engine.logits_process import FusedLogitsProcessor

    from portable_guided.integrations import lmdeploy as plugin

    monkeypatch.setattr(FusedLogitsProcessor, "_wait_stream_once", _no_wait)
    tok = tokenizer()
    with plugin_off():
        own = decode_all(GuidedDecodingManager(tok, VOCAB))
    assert plugin.taken_over() == {"apply": "verified"}
    ours = decode_all(GuidedDecodingManager(tok, VOCAB))
    monkeypatch.setenv("PORTABLE_GUIDED_LMDEPLOY_COMPILE_WORKERS", "1")
    with plugin_loaded(monkeypatch, backend=True):
        manager = GuidedDecodingManager(tok, VOCAB)
        backend = decode_all(manager)
        manager._pg_runtime.close()
    assert ours == own and backend == own
    for tokens, (_, schema) in zip(own, CASES):
        assert tokens[-1] == tok.eos_token_id, tok.decode(tokens)
        text = tok.decode(tokens[:-1])
        jsonschema.validate(json.loads(text), schema)
