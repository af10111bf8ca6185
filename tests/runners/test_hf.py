"""The transformers logits processor: guided ``model.generate`` equals the Generator's output."""

from __future__ import annotations

import json

import pytest

pytestmark = [pytest.mark.torch, pytest.mark.model, pytest.mark.xgrammar]

SCHEMA = {
    "type": "object",
    "properties": {"name": {"type": "string", "maxLength": 12}, "age": {"type": "integer"}},
    "required": ["name", "age"],
    "additionalProperties": False,
}


def test_generate_with_processor_validates_and_matches_generator(torch_runner, runtime, tokenizer):
    import jsonschema
    import torch

    from portable_guided.decode.engine import GenerationRequest, Generator
    from portable_guided.hf import GuidedLogitsProcessor
    from portable_guided.runners.weights import encode_chat, load_hf_model
    from portable_guided.runtime import GrammarSpec

    spec = GrammarSpec.json_schema(SCHEMA, any_whitespace=False)
    prompts = ["Describe Alice, 31, as JSON.", "A person as JSON."]
    rows = [encode_chat(tokenizer, p) for p in prompts]
    hf = load_hf_model()
    ours = Generator(torch_runner, runtime=runtime).generate(
        [GenerationRequest(r, 48, runtime.new_request(spec)) for r in rows]
    )
    for row, mine in zip(rows, ours):
        proc = GuidedLogitsProcessor(runtime, spec)
        with torch.inference_mode():
            out = hf.generate(torch.tensor([row]), logits_processor=[proc], do_sample=False,
                              max_new_tokens=48, pad_token_id=torch_runner.eos_token_id)
        generated = out[0, len(row):].tolist()
        assert generated[-1] == torch_runner.eos_token_id  # stopped by the grammar, not length
        new = generated[:-1]
        jsonschema.validate(json.loads(tokenizer.decode(new)), SCHEMA)
        assert mine.finish_reason == "stop"
        assert new == mine.token_ids


def test_processor_checks_batch_and_specs(runtime):
    import torch

    from portable_guided.hf import GuidedLogitsProcessor
    from portable_guided.runtime import GrammarSpec

    spec = GrammarSpec.regex("[ab]+")
    proc = GuidedLogitsProcessor(runtime, [spec, None, spec])
    with pytest.raises(ValueError, match="3 grammar specs for a batch of 2 rows"):
        proc(torch.zeros((2, 4), dtype=torch.long), torch.zeros((2, runtime.vocab_size)))
    # An unconstrained row passes through untouched; constrained rows are masked.
    proc = GuidedLogitsProcessor(runtime, [spec, None])
    scores = proc(torch.zeros((2, 4), dtype=torch.long), torch.zeros((2, runtime.vocab_size)))
    allowed = torch.isfinite(scores)
    assert allowed[1].all()
    a, b = runtime.info.encode("a"), runtime.info.encode("b")
    assert allowed[0, a[0]] and allowed[0, b[0]]
    assert 0 < int(allowed[0].sum()) < runtime.vocab_size


def test_beam_search_keeps_each_beams_grammar_state(runtime, tokenizer):
    """Beam search reorders and duplicates rows every step; every returned beam must still be
    a complete, schema-valid document (a row matched to the wrong state would fail)."""
    import jsonschema
    import torch

    from portable_guided.hf import GuidedLogitsProcessor
    from portable_guided.runners.weights import encode_chat, load_hf_model
    from portable_guided.runtime import GrammarSpec

    spec = GrammarSpec.json_schema(SCHEMA, any_whitespace=False)
    hf = load_hf_model()
    eos = hf.generation_config.eos_token_id
    eos = eos[0] if isinstance(eos, list) else eos
    rows = [encode_chat(tokenizer, p) for p in ["Describe Bob, 40, as JSON.", "Invent a person."]]
    width = max(len(r) for r in rows)
    ids = torch.tensor([[eos] * (width - len(r)) + r for r in rows])  # left padding
    mask = torch.tensor([[0] * (width - len(r)) + [1] * len(r) for r in rows])
    proc = GuidedLogitsProcessor(runtime, [spec, spec])
    with torch.inference_mode():
        out = hf.generate(ids, attention_mask=mask, logits_processor=[proc], num_beams=3,
                          num_return_sequences=3, do_sample=False, max_new_tokens=48,
                          pad_token_id=eos)
    assert out.shape[0] == 6
    texts = []
    for seq in out[:, width:].tolist():
        assert eos in seq, "every beam must end by the grammar's stop token"
        text = tokenizer.decode(seq[: seq.index(eos)])
        jsonschema.validate(json.loads(text), SCHEMA)
        texts.append(text)
    assert len(set(texts[:3])) > 1  # the beams really differ
