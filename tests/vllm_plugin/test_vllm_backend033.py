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
