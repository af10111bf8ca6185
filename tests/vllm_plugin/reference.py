"""Independent references for the plugin's row mappings, and random batches to feed them.

- **V1**: vLLM's own ``apply_grammar_bitmask`` (it has a CPU path): nothing to write here.
- **V2**: vLLM's own ``StructuredOutputsWorker.apply_grammar_bitmask`` runs as it is, with
  only its Triton kernel swapped for :class:`KernelTransliteration` (a line-by-line port of
  ``_apply_grammar_bitmask_kernel`` to NumPy) and CUDA streams made no-ops: vLLM's own
  mapping code decides every row. For the layout of the *other* vLLM version (not installed
  in this lane) :func:`transliterated_keys` ports that version's mapping code instead.

None of this imports portable_guided's mapping code (``rows.py``, ``v2.py``).
"""

from __future__ import annotations

import contextlib
import inspect
import random
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import numpy as np
import torch


class KernelTransliteration:
    """``_apply_grammar_bitmask_kernel[grid](...)``, one program at a time, as vLLM writes
    it (vLLM 0.32 and 0.33 have the same kernel: fingerprint ``v2_kernel``)."""

    def __init__(self) -> None:
        self.launches = 0

    def __getitem__(self, grid: tuple[int, int]) -> Any:
        def launch(logits_ptr: torch.Tensor, logits_stride: int, logits_indices_ptr: torch.Tensor,
                   cu_num_logits_ptr: torch.Tensor, bitmask_ptr: torch.Tensor,
                   bitmask_stride: int, vocab_size: int, MASK_STRIDE: int,
                   BLOCK_SIZE: int) -> None:
            self.launches += 1
            flat_logits = logits_ptr.view(-1) if logits_ptr.is_contiguous() else None
            assert flat_logits is not None, "the transliteration addresses contiguous logits"
            mapping = logits_indices_ptr.numpy()
            cu = cu_num_logits_ptr.numpy()
            words = bitmask_ptr.contiguous().view(-1).numpy()
            for bitmask_idx in range(grid[0]):  # tl.program_id(0)
                mapping_idx = int(mapping[bitmask_idx])
                req_idx = mapping_idx // MASK_STRIDE
                position_idx = mapping_idx % MASK_STRIDE
                logits_idx = int(cu[req_idx])
                num_req_logits = int(cu[req_idx + 1]) - logits_idx
                logits_idx += position_idx
                position_is_active = position_idx < num_req_logits
                for block_id in range(grid[1]):  # tl.program_id(1)
                    bitmask_offset = (block_id * BLOCK_SIZE) // 32 + np.arange(BLOCK_SIZE // 32)
                    load_ok = bitmask_offset < bitmask_stride
                    packed = np.zeros(BLOCK_SIZE // 32, dtype=np.int32)
                    packed[load_ok] = words[bitmask_idx * bitmask_stride + bitmask_offset[load_ok]]
                    bits = ((packed[:, None] >> np.arange(32)[None, :]) & 1) == 0
                    bits = bits.reshape(BLOCK_SIZE)
                    block_offset = block_id * BLOCK_SIZE + np.arange(BLOCK_SIZE)
                    store = position_is_active & bits & (block_offset < vocab_size)
                    if store.any():
                        where = logits_idx * logits_stride + block_offset[store]
                        flat_logits[torch.from_numpy(where)] = -float("inf")

        return launch


@contextlib.contextmanager
def cpu_streams() -> Iterator[None]:
    """vLLM's V2 method calls CUDA stream APIs around its copies: no-ops on the CPU."""
    stream = SimpleNamespace(wait_stream=lambda other: None)
    saved = (torch.cuda.stream, torch.cuda.current_stream, torch.cuda.Stream)
    torch.cuda.stream = lambda s=None: contextlib.nullcontext()  # type: ignore[assignment]
    torch.cuda.current_stream = lambda device=None: stream  # type: ignore[assignment]
    torch.cuda.Stream = lambda *a, **k: stream  # type: ignore[assignment,misc]
    try:
        yield
    finally:
        torch.cuda.stream, torch.cuda.current_stream, torch.cuda.Stream = saved  # type: ignore[misc]


def make_worker(mask_stride: int, vocab: int, max_num_logits: int, num_bonus_tokens: int = 1) -> Any:
    """vLLM's own ``StructuredOutputsWorker``, built by its own ``__init__`` on the CPU."""
    from vllm.v1.worker.gpu.structured_outputs import StructuredOutputsWorker

    kwargs: dict[str, Any] = {"max_num_logits": max_num_logits, "vocab_size": vocab,
                              "device": torch.device("cpu"), "mask_stride": mask_stride}
    if "num_bonus_tokens" in inspect.signature(StructuredOutputsWorker.__init__).parameters:
        kwargs["num_bonus_tokens"] = num_bonus_tokens
    with cpu_streams():
        worker = StructuredOutputsWorker(**kwargs)
    if not hasattr(worker, "num_bonus_tokens"):
        # vLLM 0.33's worker has none; tests that run 0.32's compact layout on it need it.
        worker.num_bonus_tokens = num_bonus_tokens
    return worker


def vllm_v2_apply(original: Any, worker: Any, logits: torch.Tensor, input_batch: Any,
                  grammar_req_ids: list[str], bitmask: np.ndarray) -> int:
    """vLLM's own V2 method (``original``: the function vLLM defines, not a patched one) with
    the kernel transliterated; returns how many kernel launches it made."""
    from vllm.v1.worker.gpu import structured_outputs as module

    kernel = KernelTransliteration()
    saved = module._apply_grammar_bitmask_kernel
    module._apply_grammar_bitmask_kernel = kernel
    try:
        with cpu_streams():
            original(worker, logits, input_batch, grammar_req_ids, bitmask)
    finally:
        module._apply_grammar_bitmask_kernel = saved
    return kernel.launches


def transliterated_keys(layout: str, input_batch: Any, grammar_req_ids: list[str],
                        mask_stride: int, num_bonus_tokens: int) -> list[int]:
    """The mapping code of the vLLM version that uses ``layout``, ported as written:
    0.32's ``_build_grammar_mapping`` (``compact``) or 0.33's inline comprehension
    (``block``)."""
    req_id_to_idx = {req_id: i for i, req_id in enumerate(input_batch.req_ids)}
    if layout == "block":
        return [req_id_to_idx[req_id] * mask_stride + position
                for req_id in grammar_req_ids for position in range(mask_stride)]
    mapping: list[int] = []
    for grammar_req_id in grammar_req_ids:
        req_idx = req_id_to_idx[grammar_req_id]
        if input_batch.num_draft_tokens_per_req is None:
            num_positions = int(input_batch.cu_num_logits_np[req_idx + 1]
                                - input_batch.cu_num_logits_np[req_idx])
        else:
            num_positions = int(input_batch.num_draft_tokens_per_req[req_idx]) + num_bonus_tokens
        mapping.extend(req_idx * mask_stride + position for position in range(num_positions))
    return mapping


def transliterated_v2_apply(layout: str, logits: torch.Tensor, input_batch: Any,
                            grammar_req_ids: list[str], bitmask: np.ndarray, mask_stride: int,
                            num_bonus_tokens: int = 1) -> None:
    """The other version's V2 method: its mapping ported, then the kernel transliteration."""
    keys = transliterated_keys(layout, input_batch, grammar_req_ids, mask_stride,
                               num_bonus_tokens)
    assert len(keys) == bitmask.shape[0], (len(keys), bitmask.shape)
    block = 1024
    grid = (len(keys), -(-logits.shape[-1] // block))
    KernelTransliteration()[grid](
        logits, logits.stride(0), torch.tensor(keys, dtype=torch.int32),
        input_batch.cu_num_logits, torch.from_numpy(bitmask), bitmask.shape[1],
        logits.shape[-1], MASK_STRIDE=mask_stride, BLOCK_SIZE=block)


# ---------------------------------------------------------------------------------------
# Random batches


def random_words(rng: random.Random, n_rows: int, vocab: int) -> np.ndarray:
    """Bitmask rows: half dense random words, half JSON-like (a few allowed tokens)."""
    words = (vocab + 31) // 32
    bitmask = np.zeros((n_rows, words), dtype=np.int32)
    for row in bitmask:
        if rng.random() < 0.5:
            row[:] = np.random.default_rng(rng.randrange(1 << 30)).integers(
                -(1 << 31), 1 << 31, words, dtype=np.int64).astype(np.int32)
        else:
            for t in rng.sample(range(vocab), min(40, vocab)):
                row[t // 32] |= np.int32(np.uint32(1 << (t % 32)).view(np.int32))
    return bitmask


def v1_step(rng: random.Random, vocab: int, depth: int, layout: str) -> dict[str, Any]:
    """A V1 step: batch order, scheduler order (with a request the batch no longer holds),
    up to ``depth`` speculative tokens per request, unconstrained requests, and the bitmask
    in ``layout`` (``block``: ``depth + 1`` rows per request, unused rows random)."""
    n_batch = rng.randint(1, 12)
    batch = [f"r{i}" for i in range(n_batch)]
    rng.shuffle(batch)
    structured = [r for r in batch if rng.random() < 0.7]
    if rng.random() < 0.3:
        structured.append("gone")
    if not structured:
        structured = [batch[0]]
    rng.shuffle(structured)
    spec_tokens = {r: [rng.randrange(vocab) for _ in range(rng.randint(0, depth))]
                   for r in [*batch, "gone"] if depth and rng.random() < 0.7}
    if layout == "compact":
        n_rows = sum(1 + len(spec_tokens.get(r, ())) for r in structured)
    else:
        n_rows = len(structured) * (depth + 1)
    n_logits = n_batch + sum(len(spec_tokens.get(r, ())) for r in batch)
    return {"batch": batch, "structured": structured, "spec_tokens": spec_tokens,
            "bitmask": random_words(rng, n_rows, vocab), "n_logits": n_logits}


def v2_step(rng: random.Random, vocab: int, depth: int, layout: str,
            num_bonus_tokens: int = 1) -> dict[str, Any]:
    """A V2 step: requests in batch order with ``0..depth`` scheduled drafts (prefills have
    none), drafts trimmed on the "device" (``cu_num_logits`` below the scheduled counts),
    grammar requests in shuffled scheduler order, sometimes no per-request draft counts
    (vLLM 0.32 then takes the host ``cu_num_logits_np``)."""
    n_reqs = rng.randint(1, 12)
    req_ids = [f"q{i}" for i in range(n_reqs)]
    rng.shuffle(req_ids)
    drafts = np.array([rng.randint(0, depth) for _ in range(n_reqs)], dtype=np.int32)
    with_drafts = depth > 0 and rng.random() < 0.8
    scheduled = drafts + num_bonus_tokens if with_drafts else np.ones(n_reqs, dtype=np.int32)
    host_cu = np.concatenate([[0], np.cumsum(scheduled)]).astype(np.int32)
    # Adaptive verification trims drafts on the device: counts <= scheduled, >= 1.
    trim = rng.random() < 0.5
    actual = np.array([rng.randint(1, int(s)) if trim else int(s) for s in scheduled],
                      dtype=np.int32)
    device_cu = np.concatenate([[0], np.cumsum(actual)]).astype(np.int32)
    grammar = [r for r in req_ids if rng.random() < 0.7] or [req_ids[0]]
    rng.shuffle(grammar)
    stride = depth + 1
    input_batch = SimpleNamespace(
        req_ids=req_ids, num_reqs=n_reqs,
        cu_num_logits=torch.from_numpy(device_cu.copy()), cu_num_logits_np=host_cu,
        num_draft_tokens_per_req=drafts if with_drafts else None,
        num_draft_tokens=int(drafts.sum()) if with_drafts else 0,
    )
    index = {r: i for i, r in enumerate(req_ids)}
    if layout == "block":
        n_rows = len(grammar) * stride
    elif with_drafts:
        n_rows = int(sum(drafts[index[r]] + num_bonus_tokens for r in grammar))
    else:
        n_rows = int(sum(host_cu[index[r] + 1] - host_cu[index[r]] for r in grammar))
    return {"input_batch": input_batch, "grammar": grammar, "stride": stride,
            "bitmask": random_words(rng, n_rows, vocab), "n_logits": int(host_cu[-1])}
