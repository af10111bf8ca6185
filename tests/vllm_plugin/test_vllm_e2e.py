"""vLLM 0.32 end to end, engine in process: the plugin on and off give the same greedy tokens.

Every comparison runs in one engine in one mode (thread counts change numerics). Modes:
``off`` (vLLM alone), ``apply`` (our bitmask application), ``runtime`` (our application and
our grammar runtime as vLLM's structured-output backend).
"""

from __future__ import annotations

import json
import re

import jsonschema
import pytest
from vllm import SamplingParams
from vllm.sampling_params import StructuredOutputsParams

from .conftest import ENGINE_ARGS, generate, manager, model_dir, plugin_mode

PERSON = {
    "type": "object",
    "properties": {"name": {"type": "string", "maxLength": 20},
                   "age": {"type": "integer", "minimum": 0, "maximum": 150}},
    "required": ["name", "age"],
}
CITY = {
    "type": "object",
    "properties": {"city": {"type": "string", "maxLength": 20},
                   "country": {"type": "string", "enum": ["France", "Japan", "Peru"]},
                   "population": {"type": "integer"}},
    "required": ["city", "country"],
}
PHONE = r"[0-9]{3}-[0-9]{4}"
CHOICES = ["yes", "no", "maybe"]
EBNF = 'root ::= "#" [a-f0-9] [a-f0-9] [a-f0-9] [a-f0-9] [a-f0-9] [a-f0-9]'


def _params(kind: str | None, max_tokens: int = 48) -> SamplingParams:
    so = {
        None: None,
        "person": StructuredOutputsParams(json=PERSON),
        "city": StructuredOutputsParams(json=CITY),
        "phone": StructuredOutputsParams(regex=PHONE),
        "choice": StructuredOutputsParams(choice=CHOICES),
        "color": StructuredOutputsParams(grammar=EBNF),
    }[kind]
    return SamplingParams(temperature=0, max_tokens=max_tokens, structured_outputs=so)


MIXED = [
    ("A user profile for Ada Lovelace as JSON:", "person"),
    ("Tell me about the weather today.", None),
    ("A city record for Lima as JSON:", "city"),
    ("A phone number:", "phone"),
    ("Is the sky blue? Answer:", "choice"),
    ("Write one short sentence about cats.", None),
    ("A hex color for the sea:", "color"),
    ("A user profile for Alan Turing as JSON:", "person"),
]


def _run(llm, batch):
    outs = generate(llm, [p for p, _ in batch], [_params(kind) for _, kind in batch])
    return [(list(o.token_ids), o.text, o.finish_reason) for o in outs]


def _check_valid(kind, text, finish):
    if kind is None or finish != "stop":
        return
    if kind in ("person", "city"):
        jsonschema.validate(json.loads(text), PERSON if kind == "person" else CITY)
    elif kind == "phone":
        assert re.fullmatch(PHONE, text), text
    elif kind == "choice":
        assert text in CHOICES, text
    elif kind == "color":
        assert re.fullmatch(r"#[a-f0-9]{6}", text), text


def _run_off_then(llm, mode, batch):
    """Run ``batch`` with the plugin off, then in ``mode``: the same greedy tokens, and every
    finished constrained output valid. Returns the outputs in ``mode``."""
    with plugin_mode(llm, "off"):
        reference = _run(llm, batch)
    with plugin_mode(llm, mode):
        ours = _run(llm, batch)
    for (prompt, kind), ref, got in zip(batch, reference, ours):
        assert got[0] == ref[0], (mode, prompt, ref[1], got[1])
        _check_valid(kind, got[1], got[2])
    return ours


@pytest.mark.parametrize("mode", ["apply", "runtime"])
def test_mixed_batch_token_identical_and_valid(llm, mode):
    """JSON schema, regex, choice, EBNF and unconstrained rows in one batch."""
    ours = _run_off_then(llm, mode, MIXED)
    finished = [got[2] == "stop" for (_, kind), got in zip(MIXED, ours) if kind is not None]
    assert sum(finished) >= len(finished) - 1, ours  # the outputs were really checked


@pytest.mark.parametrize("mode", ["off", "apply", "runtime", "runtime-default"])
def test_constraint_changes_output(llm, mode):
    """A control: the same prompt unconstrained does not follow the regex, so the masks
    above really acted."""
    with plugin_mode(llm, mode):
        free, phone = _run(llm, [("A phone number:", None), ("A phone number:", "phone")])
    assert re.fullmatch(PHONE, phone[1]) and not re.fullmatch(PHONE, free[1])


def test_default_engine_outputs_are_valid(llm):
    """The backend's default engine (``auto``: the fastest first token on new schemas) on
    the mixed batch and on MaskBench schemas: every finished constrained output valid (not
    token-identical: llguidance allows optional whitespace where xgrammar does not)."""
    from portable_guided.integrations.vllm import backend

    schemas = _maskbench_cases(5)
    batch = [*MIXED]
    with plugin_mode(llm, "runtime-default"):
        outs = _run(llm, batch)
        json_outs = generate(llm, [f"Return a JSON object for this schema: {json.dumps(s)[:200]}\n"
                                   for s in schemas],
                             [SamplingParams(temperature=0, max_tokens=48,
                                             structured_outputs=StructuredOutputsParams(json=s))
                              for s in schemas])
        assert manager(llm).backend.runtime.engine == backend.BACKEND_ENGINE == "auto"
    finished = 0
    for (_, kind), (_, text, finish) in zip(batch, outs):
        _check_valid(kind, text, finish)
        finished += kind is not None and finish == "stop"
    assert finished >= sum(kind is not None for _, kind in batch) - 1, outs
    for schema, out in zip(schemas, json_outs):
        if out.finish_reason == "stop":
            jsonschema.validate(json.loads(out.text), schema)


def _maskbench_cases(n: int):
    from pathlib import Path

    path = Path("/work/shared/data/maskbench/Glaiveai2K.jsonl")
    if not path.exists():
        pytest.skip(f"{path} not found (the shared MaskBench data)")
    cases = []
    with path.open() as f:
        for line in f:
            item = json.loads(line)
            text = json.dumps(item["schema"])
            if len(text) < 600:
                cases.append(item["schema"])
            if len(cases) == n:
                break
    return cases


@pytest.mark.parametrize("mode", ["apply", "runtime"])
def test_maskbench_schemas_token_identical(llm, mode):
    schemas = _maskbench_cases(5)
    prompts = [f"Return a JSON object for this schema: {json.dumps(s)[:200]}\n" for s in schemas]
    params = [SamplingParams(temperature=0, max_tokens=48,
                             structured_outputs=StructuredOutputsParams(json=s)) for s in schemas]
    with plugin_mode(llm, "off"):
        ref = generate(llm, prompts, params)
    with plugin_mode(llm, mode):
        got = generate(llm, prompts, params)
    for schema, r, g in zip(schemas, ref, got):
        assert list(g.token_ids) == list(r.token_ids)
        if g.finish_reason == "stop":
            jsonschema.validate(json.loads(g.text), schema)


def _step_all(llm, requests):
    """Run ``(name, prompt, params)`` requests; returns ``(add-time errors, outputs)``."""
    outs = generate(llm, [p for _, p, _ in requests], [sp for _, _, sp in requests])
    errors = {name: o for (name, _, _), o in zip(requests, outs) if isinstance(o, Exception)}
    outputs = {name: o for (name, _, _), o in zip(requests, outs) if not isinstance(o, Exception)}
    return errors, outputs


@pytest.mark.parametrize("mode", ["apply", "runtime"])
def test_bad_schema_fails_that_request_only(llm, mode):
    bad = {"type": "object", "properties": {"a": {"type": "string", "pattern": "(a"}}}
    requests = [
        ("ok-1", "A user profile for Ada as JSON:", _params("person")),
        ("bad", "A user profile for Bob as JSON:",
         SamplingParams(temperature=0, max_tokens=32,
                        structured_outputs=StructuredOutputsParams(json=bad))),
        ("ok-2", "A phone number:", _params("phone")),
    ]
    with plugin_mode(llm, "off"):
        ref_errors, ref = _step_all(llm, requests)
    with plugin_mode(llm, mode):
        errors, got = _step_all(llm, requests)
    assert set(errors) == set(ref_errors) == {"bad"}
    assert "bad" not in got
    for req_id in ("ok-1", "ok-2"):
        assert list(got[req_id].token_ids) == list(ref[req_id].token_ids)
        assert got[req_id].finish_reason == "stop"


def _slow_schema() -> dict:
    """A schema vLLM accepts whose xgrammar compile takes minutes here (anchored: the
    runtime refuses an unanchored pattern at once, which tests no time limit)."""
    schema: dict = {"type": "string", "pattern": "^[a-z]{1,5}$"}
    for i in range(12):  # xgrammar compile time grows ~3x every 2 levels
        schema = {"anyOf": [
            {"type": "object", "properties": {f"k{i}": schema, "x": {"type": "integer"}},
             "required": [f"k{i}"]},
            {"type": "array", "items": schema, "minItems": 1, "maxItems": 3}]}
    return schema


def test_runtime_compiles_leave_vllms_grammar_thread_free(llm, monkeypatch):
    """vLLM compiles grammars on a small thread pool (one thread on two cores). Our backend
    only hands each spec to the runtime there, so a long compile holds neither that thread
    nor the compiles of the requests after it: here a fast schema submitted after a
    minutes-long one is ready while the long one still compiles (a backend waiting in vLLM's
    thread made it wait the long one's time limit first)."""
    import time

    from .conftest import manager

    monkeypatch.setenv("PORTABLE_GUIDED_VLLM_COMPILE_TIMEOUT_S", "20")
    monkeypatch.setenv("PORTABLE_GUIDED_VLLM_COMPILE_WORKERS", "2")
    engine = llm.llm_engine
    scheduler = engine.engine_core.engine_core.scheduler
    with plugin_mode(llm, "runtime"):
        generate(llm, ["Warm up:"], [_params("person", max_tokens=2)])  # backend built
        start = time.perf_counter()
        engine.add_request("slow", "Anything:", SamplingParams(
            temperature=0, max_tokens=4,
            structured_outputs=StructuredOutputsParams(json=_slow_schema())))
        engine.add_request("fast", "A user profile for Ada as JSON:", _params("city"))
        pending = {r.request_id.split("-")[0]: r.structured_output_request
                   for r in scheduler.requests.values()}
        probe = manager(llm).executor.submit(time.perf_counter)
        while not pending["fast"].is_grammar_ready and time.perf_counter() - start < 20:
            time.sleep(0.01)
        fast_ready = time.perf_counter() - start
        assert fast_ready < 10, f"the fast grammar waited {fast_ready:.1f} s"
        assert probe.result(timeout=1) - start < 10
        assert not pending["slow"].is_grammar_ready  # still compiling in a worker
        engine.abort_request(["slow", "fast"])
        while engine.has_unfinished_requests():
            engine.step()


def test_runtime_starts_with_the_engine(llm):
    """With the runtime backend on, vLLM's structured-output manager starts our runtime
    (and its compile worker) when it is built: the first structured request's backend uses
    that runtime, whose worker was already running, instead of starting one then."""
    import time
    from types import SimpleNamespace

    from vllm.v1.structured_output import StructuredOutputManager
    from vllm.v1.structured_output.backend_types import StructuredOutputOptions

    from portable_guided.integrations.vllm import backend as backend_mod
    from portable_guided.runtime import GrammarRuntime

    from .conftest import set_plugin

    set_plugin("runtime")
    try:
        mgr = StructuredOutputManager(llm.llm_engine.vllm_config)
    finally:
        set_plugin("off")
    try:
        runtime = mgr._portable_guided_runtime
        assert isinstance(runtime, GrammarRuntime) and mgr.backend is None
        deadline = time.monotonic() + 120
        while not runtime.worker_pids() and time.monotonic() < deadline:
            time.sleep(0.05)
        workers = runtime.worker_pids()
        assert workers, "the compile worker did not start with the manager"
        structured = SimpleNamespace(
            grammar=None, structured_output_key=(StructuredOutputOptions.JSON,
                                                 json.dumps(PERSON)))
        request = SimpleNamespace(
            request_id="first", structured_output_request=structured,
            sampling_params=SimpleNamespace(
                structured_outputs=SimpleNamespace(_backend="xgrammar")))
        backend_mod._grammar_init(mgr, request)
        assert isinstance(mgr.backend, backend_mod.PortableGuidedBackend)
        assert mgr.backend.runtime is runtime and mgr._portable_guided_runtime is None
        grammar = structured.grammar.result(timeout=60)
        assert isinstance(grammar, backend_mod.PortableGuidedGrammar)
        # Compiled by the workers started earlier (a spare may have joined them since).
        assert set(workers) <= set(runtime.worker_pids())
    finally:
        if mgr.backend is not None:
            mgr.backend.destroy()
        elif mgr._portable_guided_runtime is not None:
            mgr._portable_guided_runtime.close()


def test_runtime_failing_at_engine_start_leaves_the_engine_starting(llm, monkeypatch, caplog):
    """A runtime that cannot start with the engine (e.g. an unusual tokenizer) never stops
    vLLM's manager from being built: one warning, and the first request tries again."""
    from vllm.v1.structured_output import StructuredOutputManager

    from portable_guided.integrations.vllm import backend as backend_mod

    from .conftest import set_plugin

    def broken(tokenizer, vocab_size):
        raise ValueError("no tokenizer info for this tokenizer")

    monkeypatch.setattr(backend_mod, "start_runtime", broken)
    set_plugin("runtime")
    try:
        with caplog.at_level("WARNING", logger="vllm.plugins.portable_guided"):
            mgr = StructuredOutputManager(llm.llm_engine.vllm_config)
    finally:
        set_plugin("off")
    assert mgr._portable_guided_runtime is None and mgr.backend is None
    assert "no tokenizer info for this tokenizer" in caplog.text
    assert "try again at the first structured request" in caplog.text


def test_runtime_compile_time_limit_fails_that_request_only(llm, monkeypatch):
    """A schema vLLM accepts but whose compile runs past the runtime's limit: that request
    ends with an error, the others finish as usual, the engine keeps serving."""
    schema = _slow_schema()
    monkeypatch.setenv("PORTABLE_GUIDED_VLLM_COMPILE_TIMEOUT_S", "2")
    requests = [
        ("ok", "A user profile for Ada as JSON:", _params("person")),
        ("slow", "Anything:", SamplingParams(
            temperature=0, max_tokens=16, structured_outputs=StructuredOutputsParams(json=schema))),
    ]
    with plugin_mode(llm, "runtime"):
        errors, got = _step_all(llm, requests)
        again, after = _step_all(llm, [requests[0]])
    assert not errors and not again
    assert got["slow"].finish_reason == "error" or got["slow"].text == "", got["slow"]
    assert got["ok"].finish_reason == "stop"
    jsonschema.validate(json.loads(got["ok"].text), PERSON)
    assert list(after["ok"].token_ids) == list(got["ok"].token_ids)


@pytest.fixture(scope="module")
def spec_llm(llm):
    """A second engine with vLLM's n-gram speculative decoding (3 draft tokens)."""
    from vllm import LLM

    engine = LLM(model=model_dir(), **ENGINE_ARGS, speculative_config={
        "method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 3,
        "prompt_lookup_min": 1})
    yield engine
    del engine


@pytest.mark.parametrize("mode", ["apply", "runtime"])
def test_ngram_speculative_decoding(spec_llm, llm, mode):
    """Draft rows take the bitmask rows of their positions; outputs equal plugin-off ones.
    The prompts repeat JSON so that n-gram drafts are proposed and accepted."""
    batch = [
        ('{"name": "Ada", "age": 36} {"name": "Alan", "age": 41} Another one as JSON:', "person"),
        ("Numbers: 555-1234, 555-9876, 555-1111. One more:", "phone"),
        ("Tell me about the weather today.", None),
    ]
    _run_off_then(spec_llm, mode, batch)
