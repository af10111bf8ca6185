"""vLLM's Model Runner V2 ``StructuredOutputsWorker.apply_grammar_bitmask``, served by
:func:`portable_guided.apply_token_mask`.

V2 (vLLM's default runner on CUDA) keys every bitmask row by ``(request, position)`` and lets
its Triton kernel find the logits row on the device: ``cu_num_logits[req_idx] + position``,
skipped when ``position`` is at or beyond the request's logits count (adaptive verification
trims drafts on the device, after the host built the batch). We keep exactly that mapping
(:func:`.rows.v2_keys`, :func:`.rows.v2_rows`) and apply through ``apply_token_mask`` in the
logits' dtype:

- on the CPU the rows are computed on the host from ``input_batch.cu_num_logits`` (a CPU
  tensor there, so reading it costs nothing) and only constrained rows are named;
- on any other device the row of each key is computed on the device from the device
  ``cu_num_logits``, with no host sync: keys whose position is inactive land on a scratch
  row past the logits, every other row of a logits-tall bitmask allows everything.

``grammar_invalid_drafts`` stays vLLM's.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

import numpy as np

from ...apply import apply_token_mask
from .apply import apply_rows, finish_apply
from .guard import Takeover, kinds, layout_for_version, reference_v2_apply
from .rows import v2_keys, v2_rows

__all__ = ["TAKEOVER", "apply_grammar_bitmask", "apply_v2", "vllm_keys"]

logger = logging.getLogger("vllm.plugins.portable_guided")

#: Set by :func:`portable_guided.integrations.vllm.register` when V2 is taken over.
TAKEOVER: Takeover | None = None


def _positions(worker: Any, input_batch: Any) -> Any:
    """Positions per request in vLLM 0.32's compact layout, as its ``_build_grammar_mapping``
    computes them on the host."""
    drafts = getattr(input_batch, "num_draft_tokens_per_req", None)
    if drafts is None:
        return np.diff(np.asarray(input_batch.cu_num_logits_np, dtype=np.int64))
    return np.asarray(drafts, dtype=np.int64) + int(worker.num_bonus_tokens)


def apply_v2(
    worker: Any,
    logits: Any,
    input_batch: Any,
    grammar_req_ids: list[str],
    grammar_bitmask: Any,
    layout: str,
) -> None:
    """V2's apply for one scheduler bitmask ``layout``; ``worker`` is vLLM's
    ``StructuredOutputsWorker`` (``mask_stride``, and ``num_bonus_tokens`` in 0.32)."""
    if not grammar_req_ids:
        return
    stride = int(worker.mask_stride)
    positions = None if layout == "block" else _positions(worker, input_batch)
    keys = v2_keys(input_batch.req_ids, grammar_req_ids, stride, layout, positions)
    bitmask = np.asarray(grammar_bitmask)
    if bitmask.shape[0] != len(keys):
        raise ValueError(
            f"vLLM sent {bitmask.shape[0]} grammar bitmask rows for {len(grammar_req_ids)} "
            f"requests, but the {layout} layout with mask_stride {stride} maps {len(keys)}"
        )
    cu_num_logits = input_batch.cu_num_logits
    if getattr(logits, "is_cpu", True):
        bitmask_rows, logits_rows = v2_rows(keys, stride, np.asarray(cu_num_logits))
        if not len(logits_rows):
            return
        masked = apply_rows(logits, bitmask, logits_rows, bitmask_rows)
    else:
        masked = _apply_on_device(logits, cu_num_logits, keys, bitmask, stride)
    finish_apply(logits, masked, "V2")


def _apply_on_device(logits: Any, cu_num_logits: Any, keys: Any, bitmask: Any,
                     stride: int) -> Any:
    """Rows computed on the logits' device from the device ``cu_num_logits``: no host sync."""
    import torch

    device = logits.device
    keys_dev = torch.from_numpy(keys).to(device, non_blocking=True)
    words = torch.from_numpy(bitmask).to(device, non_blocking=True)
    cu = cu_num_logits.to(device=device, dtype=torch.int64)
    req_idx = torch.div(keys_dev, stride, rounding_mode="floor")
    position = keys_dev - req_idx * stride
    start = cu[req_idx]
    active = position < cu[req_idx + 1] - start
    n_logits = logits.shape[0]
    target = torch.where(active, start + position, torch.full_like(start, n_logits))
    # All-allowed rows leave logits bit for bit; the extra row takes the inactive keys.
    placed = torch.full((n_logits + 1, words.shape[1]), -1, dtype=torch.int32, device=device)
    placed.index_copy_(0, target, words)
    return apply_token_mask(logits, placed[:n_logits])


def vllm_keys(worker: Any, input_batch: Any, grammar_req_ids: list[str], layout: str) -> list[int]:
    """The keys as vLLM's own code builds them (independent of :func:`.rows.v2_keys`): vLLM
    0.32's ``_build_grammar_mapping``, or vLLM 0.33's inline comprehension transliterated."""
    if layout == "compact":
        from vllm.v1.worker.gpu import structured_outputs

        return list(structured_outputs._build_grammar_mapping(
            input_batch.req_ids, grammar_req_ids, input_batch.cu_num_logits_np,
            input_batch.num_draft_tokens_per_req, worker.num_bonus_tokens, worker.mask_stride,
        ))
    req_id_to_idx = {req_id: i for i, req_id in enumerate(input_batch.req_ids)}
    return [
        req_id_to_idx[req_id] * worker.mask_stride + position
        for req_id in grammar_req_ids
        for position in range(worker.mask_stride)
    ]


def apply_grammar_bitmask(
    self: Any,
    logits: Any,
    input_batch: Any,
    grammar_req_ids: list[str],
    grammar_bitmask: Any,
) -> None:
    """Drop-in for ``StructuredOutputsWorker.apply_grammar_bitmask`` (vLLM 0.32, 0.33)."""
    takeover = TAKEOVER
    if takeover is None:
        import vllm

        apply_v2(self, logits, input_batch, grammar_req_ids, grammar_bitmask,
                 layout_for_version(str(vllm.__version__)))
        return
    canary = takeover.canary
    if canary is not None and not canary.tripped and grammar_req_ids:
        # Host facts only (no device sync to decide).
        speculative = int(self.mask_stride) > 1 and int(
            getattr(input_batch, "num_draft_tokens", 0) or 0) > 0
        unconstrained = len(set(grammar_req_ids) & set(input_batch.req_ids)) < len(
            input_batch.req_ids)
        call = kinds(speculative, unconstrained)
        if canary.due(call):
            canary.check(
                logits, call,
                lambda out: apply_v2(self, out, input_batch, grammar_req_ids, grammar_bitmask,
                                     takeover.layout),
                lambda out: _vllms_v2(takeover, self, out, input_batch, grammar_req_ids,
                                      grammar_bitmask),
            )
            return
    apply_v2(self, logits, input_batch, grammar_req_ids, grammar_bitmask, takeover.layout)


_reference_logged = threading.Event()


def _vllms_v2(takeover: Takeover, worker: Any, logits: Any, input_batch: Any,
              grammar_req_ids: list[str], grammar_bitmask: Any) -> None:
    """vLLM's own V2 method on ``logits``; where it cannot run (its Triton kernel without a
    Triton backend for the device), the transliteration of its mapping and kernel."""
    before = logits.clone()
    try:
        takeover.original(worker, logits, input_batch, grammar_req_ids, grammar_bitmask)
        return
    except Exception as exc:  # noqa: BLE001 - any failure of theirs: compare with the reference
        logits.copy_(before)  # whatever it wrote before failing
        if not _reference_logged.is_set():
            _reference_logged.set()
            logger.info(
                "vLLM's own V2 grammar kernel cannot run here (%s: %s); portable_guided's "
                "check compares with a transliteration of vLLM's V2 mapping and kernel",
                type(exc).__name__, str(exc).splitlines()[0] if str(exc) else "")
    keys = vllm_keys(worker, input_batch, grammar_req_ids, takeover.layout)
    reference_v2_apply(logits, input_batch.cu_num_logits, keys, grammar_bitmask,
                       int(worker.mask_stride))
