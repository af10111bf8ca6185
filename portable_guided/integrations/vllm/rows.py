"""Where each grammar bitmask row of vLLM's scheduler lands in the model runner's logits.

Pure functions of host data (NumPy only), one per runner, with the layout of each supported
vLLM version as a parameter:

- **bitmask layout** (scheduler side, ``StructuredOutputManager.grammar_bitmask``):
  ``"compact"`` (vLLM 0.32: ``1 + len(spec_tokens)`` rows per request, back to back) or
  ``"block"`` (vLLM 0.33: every request owns a fixed block of ``mask_stride`` rows,
  ``mask_stride = num_speculative_tokens + 1``, its first ``1 + len(spec_tokens)`` used).
- **Model Runner V1** (``apply_grammar_bitmask`` in ``vllm/v1/structured_output/utils.py``):
  logits rows follow ``input_batch.req_ids``, one per request plus one per scheduled
  speculative token; structured requests missing from the batch are skipped.
- **Model Runner V2** (``StructuredOutputsWorker.apply_grammar_bitmask``): bitmask row ``k``
  carries a key ``req_idx * mask_stride + position``; its logits row is
  ``cu_num_logits[req_idx] + position``, written only while ``position`` is below the
  request's logits count (adaptive verification may trim drafts on the device).

The tests check these against vLLM's own functions (V1) and against vLLM's own V2 method with
its Triton kernel transliterated (V2), for both layouts.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

__all__ = ["LAYOUTS", "v1_rows", "v2_keys", "v2_rows"]

#: Scheduler bitmask layouts, by name (see the module docstring).
LAYOUTS = ("compact", "block")


def _check_layout(layout: str) -> None:
    if layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {LAYOUTS}, got {layout!r}")


def v1_rows(
    batch_req_ids: Sequence[str],
    structured_req_ids: Sequence[str],
    spec_tokens: Mapping[str, Sequence[int]],
    num_bitmask_rows: int,
    layout: str = "compact",
) -> tuple[list[int], list[int]]:
    """Model Runner V1: ``(bitmask_rows, logits_rows)``, row ``bitmask_rows[i]`` masking
    logits row ``logits_rows[i]``.

    ``num_bitmask_rows`` is the height of the scheduler's bitmask; in the ``block`` layout
    the block size is ``num_bitmask_rows // len(structured_req_ids)``, as vLLM 0.33 derives it.

    >>> v1_rows(["a", "b", "c"], ["c", "a"], {"a": [5, 6]}, 4)
    ([0, 1, 2, 3], [4, 0, 1, 2])
    >>> v1_rows(["a", "b", "c"], ["c", "a"], {"a": [5, 6]}, 6, layout="block")
    ([0, 3, 4, 5], [4, 0, 1, 2])
    """
    _check_layout(layout)
    structured = set(structured_req_ids)
    first_logit: dict[str, int] = {}
    offset = 0
    for batch_index, req_id in enumerate(batch_req_ids):
        if req_id in structured:
            first_logit[req_id] = batch_index + offset
        offset += len(spec_tokens.get(req_id, ()))
    stride = num_bitmask_rows // len(structured_req_ids) if structured_req_ids else 0
    bitmask_rows: list[int] = []
    logits_rows: list[int] = []
    cursor = 0
    for req_id in structured_req_ids:
        n = 1 + len(spec_tokens.get(req_id, ()))
        start = first_logit.get(req_id)
        if start is not None:
            bitmask_rows.extend(range(cursor, cursor + n))
            logits_rows.extend(range(start, start + n))
        cursor += n if layout == "compact" else stride
    if bitmask_rows and max(bitmask_rows) >= num_bitmask_rows:
        raise ValueError(
            f"vLLM sent {num_bitmask_rows} grammar bitmask rows, but the {layout} layout "
            f"needs row {max(bitmask_rows)} for {len(structured_req_ids)} requests"
        )
    return bitmask_rows, logits_rows


def v2_keys(
    batch_req_ids: Sequence[str],
    grammar_req_ids: Sequence[str],
    mask_stride: int,
    layout: str,
    positions: npt.NDArray[Any] | None = None,
) -> npt.NDArray[np.int64]:
    """Model Runner V2: the key ``req_idx * mask_stride + position`` of each bitmask row.

    ``block`` layout (vLLM 0.33): ``mask_stride`` positions per grammar request.
    ``compact`` layout (vLLM 0.32): ``positions[req_idx]`` positions per grammar request,
    where ``positions`` is what vLLM 0.32 computes from the host batch (scheduled drafts
    plus bonus tokens, or the host ``cu_num_logits`` differences).

    Raises ``KeyError`` naming the request when a grammar request is not in the batch
    (vLLM's own method fails the same way).
    """
    _check_layout(layout)
    if mask_stride < 1:
        raise ValueError(f"mask_stride must be >= 1, got {mask_stride}")
    index = {req_id: i for i, req_id in enumerate(batch_req_ids)}
    try:
        req_idx = np.fromiter((index[r] for r in grammar_req_ids), dtype=np.int64,
                              count=len(grammar_req_ids))
    except KeyError as exc:
        raise KeyError(f"grammar request {exc.args[0]!r} is not in the model runner's batch "
                       f"({len(batch_req_ids)} requests)") from None
    if layout == "block":
        counts = np.full(len(req_idx), mask_stride, dtype=np.int64)
    else:
        if positions is None:
            raise ValueError("the compact layout needs the number of positions per request")
        counts = np.asarray(positions, dtype=np.int64)[req_idx]
    total = int(counts.sum())
    # position of each key within its request: 0..counts[g]-1, request after request
    starts = np.repeat(np.cumsum(counts) - counts, counts)
    position = np.arange(total, dtype=np.int64) - starts
    return np.repeat(req_idx, counts) * mask_stride + position


def v2_rows(
    keys: npt.NDArray[Any], mask_stride: int, cu_num_logits: npt.NDArray[Any]
) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
    """``(bitmask_rows, logits_rows)`` of V2's kernel, on the host: key ``k`` of bitmask
    row ``b`` decodes to ``(k // mask_stride, k % mask_stride)``; the row is written only
    when the position is below that request's logits count in ``cu_num_logits``.

    >>> b, l = v2_rows(np.array([0, 1, 4]), 2, np.array([0, 2, 3, 4]))
    >>> b.tolist(), l.tolist()
    ([0, 1, 2], [0, 1, 3])
    """
    keys = np.asarray(keys, dtype=np.int64)
    cu = np.asarray(cu_num_logits, dtype=np.int64)
    req_idx, position = np.divmod(keys, mask_stride)
    start = cu[req_idx]
    active = position < cu[req_idx + 1] - start
    return np.flatnonzero(active), (start + position)[active]
