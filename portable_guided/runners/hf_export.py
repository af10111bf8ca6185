"""Export the bundled SmolLM2 GGUF model as a Hugging Face folder (for engines such as vLLM).

vLLM 0.32 cannot load this GGUF file, and ``transformers`` refuses ``save_pretrained`` on a
model loaded with ``gguf_file=``. So the folder is written by hand: ``config.json``, one
bf16 ``model.safetensors`` (without ``lm_head.weight`` when the embeddings are tied, as the
original checkpoint ships it), ``generation_config.json`` and the tokenizer files. The export
is idempotent: a folder that already holds a complete export is reused.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile

from .weights import GGUF_FILE, gguf_path

__all__ = ["export_smollm2_hf"]

_MARKER = "portable-guided-export.json"
_FORMAT = 1


def export_smollm2_hf(dest: str | os.PathLike[str], *, weights: bool = True) -> str:
    """Write SmolLM2-135M-Instruct (bf16) as a Hugging Face folder at ``dest``; return its path.

    Takes about 30 s and 260 MB the first time; later calls return at once. The folder is
    written next to ``dest`` and renamed into place, so a crash never leaves half a model.
    ``weights=False`` writes the configuration and tokenizer only (about 3.5 MB), for
    :meth:`TorchRunner.with_random_weights <portable_guided.runners.torch_runner.TorchRunner.with_random_weights>`.
    """
    dest = os.path.abspath(os.fspath(dest))
    if _is_complete(dest, weights):
        return dest
    import torch
    import transformers
    from safetensors.torch import save_file

    source = gguf_path()
    folder, name = os.path.dirname(source), os.path.basename(source)
    tokenizer = transformers.AutoTokenizer.from_pretrained(folder, gguf_file=name)
    model = transformers.AutoModelForCausalLM.from_pretrained(
        folder, gguf_file=name, torch_dtype=torch.float32
    )
    config = model.config
    state = {k: v.to(torch.bfloat16).contiguous() for k, v in model.state_dict().items()}
    if getattr(config, "tie_word_embeddings", False):
        state.pop("lm_head.weight", None)

    os.makedirs(os.path.dirname(dest), exist_ok=True)
    staging = tempfile.mkdtemp(prefix=".export-", dir=os.path.dirname(dest))
    try:
        config_dict = config.to_dict()
        config_dict.update(dtype="bfloat16", torch_dtype="bfloat16",
                           architectures=["LlamaForCausalLM"])
        # The weights are plain bf16 now: no GGUF quantization, no local source path.
        for key in ("quantization_config", "_name_or_path", "_model_name_or_path"):
            config_dict.pop(key, None)
        _write_json(os.path.join(staging, "config.json"), config_dict)
        generation = {"bos_token_id": config.bos_token_id, "eos_token_id": config.eos_token_id}
        _write_json(os.path.join(staging, "generation_config.json"), generation)
        if weights:
            save_file(state, os.path.join(staging, "model.safetensors"),
                      metadata={"format": "pt"})
        tokenizer.save_pretrained(staging)
        _write_json(os.path.join(staging, _MARKER),
                    {"format": _FORMAT, "source": GGUF_FILE, "weights": weights})
        if os.path.exists(dest):
            shutil.rmtree(dest)
        os.replace(staging, dest)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return dest


def _is_complete(folder: str, weights: bool) -> bool:
    try:
        with open(os.path.join(folder, _MARKER), encoding="utf-8") as f:
            marker = json.load(f)
            # A full export also serves a call that wants no weights.
            has_weights = marker.get("weights", True)
            return bool(marker.get("format") == _FORMAT and (has_weights or not weights))
    except (OSError, ValueError):
        return False


def _write_json(path: str, data: dict[str, object]) -> None:
    with open(path, "w", encoding="utf-8") as f:
        json.dump(data, f, indent=2, sort_keys=True)
