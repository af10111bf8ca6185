"""vLLM's ``apply_grammar_bitmask``, served by :func:`portable_guided.apply_token_mask`.

vLLM's scheduler sends one bitmask row per structured-output request and per speculative
position, in the order of ``grammar_output.structured_output_request_ids``; the model runner
must put each row on the logits row of that request and position. Upstream does this by
copying the rows into a bitmask as tall as the logits (all-allowed elsewhere) and calling
xgrammar's kernel; on the CPU it also converts bf16 logits to fp32 and back around the
kernel (two extra full copies of the logits). Here the same rows are placed, only the
constrained logits rows are named in ``indices``, and the mask is applied in place in the
logits' own dtype on whatever device they live.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from ...apply import apply_token_mask
from ...registry import resolve

__all__ = ["apply_grammar_bitmask", "grammar_rows"]

logger = logging.getLogger("vllm.plugins.portable_guided")

_first_apply = threading.Event()


def grammar_rows(
    batch_req_ids: Sequence[str],
    structured_req_ids: Sequence[str],
    spec_tokens: Mapping[str, Sequence[int]],
) -> tuple[list[int], list[int]]:
    """Where each bitmask row goes: ``(bitmask_rows, logits_rows)``.

    ``batch_req_ids`` is the model runner's request order (one logits row per request plus
    one per scheduled speculative token); ``structured_req_ids`` the order of the scheduler's
    bitmask rows (``1 + len(spec_tokens[r])`` rows per request). Requests missing from the
    batch are skipped, as upstream does.

    >>> grammar_rows(["a", "b", "c"], ["c", "a"], {"a": [5, 6]})
    ([0, 1, 2, 3], [4, 0, 1, 2])
    """
    structured = set(structured_req_ids)
    first_logit: dict[str, int] = {}
    offset = 0
    for batch_index, req_id in enumerate(batch_req_ids):
        if req_id in structured:
            first_logit[req_id] = batch_index + offset
        offset += len(spec_tokens.get(req_id, ()))
    bitmask_rows: list[int] = []
    logits_rows: list[int] = []
    cursor = 0
    for req_id in structured_req_ids:
        n = 1 + len(spec_tokens.get(req_id, ()))
        start = first_logit.get(req_id)
        if start is not None:
            bitmask_rows.extend(range(cursor, cursor + n))
            logits_rows.extend(range(start, start + n))
        cursor += n
    return bitmask_rows, logits_rows


def apply_grammar_bitmask(
    scheduler_output: Any,
    grammar_output: Any,
    input_batch: Any,
    logits: Any,
) -> None:
    """Drop-in for ``vllm.v1.structured_output.utils.apply_grammar_bitmask`` (vLLM 0.32).

    Same semantics: each scheduler row masks the logits row of its request and speculative
    position; rows of requests without a grammar are left untouched.
    """
    bitmask = np.asarray(grammar_output.grammar_bitmask)
    bitmask_rows, logits_rows = grammar_rows(
        input_batch.req_ids,
        grammar_output.structured_output_request_ids,
        scheduler_output.scheduled_spec_decode_tokens,
    )
    if not logits_rows:
        return
    n_logits = int(logits.shape[0])
    if logits_rows == list(range(n_logits)) and bitmask_rows == logits_rows:
        # The common decode step: every row constrained, already in batch order.
        apply_token_mask(logits, bitmask[:n_logits])
    else:
        # Our indices select the same row of logits and bitmask: lay the rows out as tall
        # as the logits. Rows not named in ``indices`` are never read, so they stay unset.
        placed = np.empty((n_logits, bitmask.shape[1]), dtype=np.int32)
        placed[logits_rows] = bitmask[bitmask_rows]
        apply_token_mask(logits, placed, indices=logits_rows)
    if not _first_apply.is_set():
        _first_apply.set()
        logger.info(
            "portable_guided applied the first grammar bitmask in this process (pid %d): %s",
            os.getpid(), resolve(logits),
        )
