"""vLLM's Model Runner V1 ``apply_grammar_bitmask``, served by :func:`portable_guided.apply_token_mask`.

vLLM's scheduler sends bitmask rows per structured-output request and speculative position,
in the order of ``grammar_output.structured_output_request_ids`` (layout per version, see
:mod:`.rows`); the model runner must put each row on the logits row of that request and
position. Upstream copies the rows into a bitmask as tall as the logits (all-allowed
elsewhere) and calls xgrammar's kernel; on the CPU it also converts bf16 logits to fp32 and
back around the kernel (two extra full copies of the logits). Here the same rows are placed,
only the constrained logits rows are named in ``indices``, and the mask is applied in place
in the logits' own dtype on whatever device they live.
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
from .guard import Takeover, kinds, layout_for_version
from .rows import v1_rows

__all__ = ["TAKEOVER", "apply_grammar_bitmask", "apply_v1", "grammar_rows"]

logger = logging.getLogger("vllm.plugins.portable_guided")

#: Runner ("V1", "V2") -> set once its first apply was logged.
_first_apply: dict[str, threading.Event] = {}

#: Set by :func:`portable_guided.integrations.vllm.register` when V1 is taken over: the
#: layout of the verified build, vLLM's own function and the canary.
TAKEOVER: Takeover | None = None


def grammar_rows(
    batch_req_ids: Sequence[str],
    structured_req_ids: Sequence[str],
    spec_tokens: Mapping[str, Sequence[int]],
) -> tuple[list[int], list[int]]:
    """vLLM 0.32's rows (compact layout): ``(bitmask_rows, logits_rows)``; see
    :func:`.rows.v1_rows`.

    >>> grammar_rows(["a", "b", "c"], ["c", "a"], {"a": [5, 6]})
    ([0, 1, 2, 3], [4, 0, 1, 2])
    """
    n_rows = sum(1 + len(spec_tokens.get(r, ())) for r in structured_req_ids)
    return v1_rows(batch_req_ids, structured_req_ids, spec_tokens, n_rows, "compact")


def apply_grammar_bitmask(
    scheduler_output: Any,
    grammar_output: Any,
    input_batch: Any,
    logits: Any,
) -> None:
    """Drop-in for ``vllm.v1.structured_output.utils.apply_grammar_bitmask`` (vLLM 0.32, 0.33).

    Same semantics: each scheduler row masks the logits row of its request and speculative
    position; rows of requests without a grammar are left untouched. Installed by the
    plugin, it uses the verified build's layout and, on the first call of each kind, checks
    itself against vLLM's own function (see :mod:`.guard`).
    """
    takeover = TAKEOVER
    if takeover is None:
        import vllm

        apply_v1(scheduler_output, grammar_output, input_batch, logits,
                 layout_for_version(str(vllm.__version__)))
        return
    canary = takeover.canary
    if canary is not None and not canary.tripped:
        spec_tokens = scheduler_output.scheduled_spec_decode_tokens
        structured = grammar_output.structured_output_request_ids
        speculative = any(spec_tokens.get(r) for r in structured)
        n_constrained = sum(1 + len(spec_tokens.get(r, ())) for r in set(structured)
                            & set(input_batch.req_ids))
        unconstrained = n_constrained < int(logits.shape[0])
        call = kinds(speculative, unconstrained)
        if canary.due(call):
            canary.check(
                logits, call,
                lambda out: apply_v1(scheduler_output, grammar_output, input_batch, out,
                                     takeover.layout),
                lambda out: takeover.original(scheduler_output, grammar_output, input_batch,
                                              out),
            )
            return
    apply_v1(scheduler_output, grammar_output, input_batch, logits, takeover.layout)


def apply_v1(
    scheduler_output: Any,
    grammar_output: Any,
    input_batch: Any,
    logits: Any,
    layout: str,
) -> None:
    """V1's apply for one scheduler bitmask ``layout`` (``compact`` or ``block``)."""
    bitmask = np.asarray(grammar_output.grammar_bitmask)
    bitmask_rows, logits_rows = v1_rows(
        input_batch.req_ids,
        grammar_output.structured_output_request_ids,
        scheduler_output.scheduled_spec_decode_tokens,
        int(bitmask.shape[0]),
        layout,
    )
    if not logits_rows:
        return
    n_logits = int(logits.shape[0])
    if logits_rows == list(range(n_logits)) and bitmask_rows == logits_rows:
        # The common decode step: every row constrained, already in batch order.
        masked = apply_token_mask(logits, bitmask[:n_logits])
    else:
        masked = apply_rows(logits, bitmask, logits_rows, bitmask_rows)
    finish_apply(logits, masked, "V1")


def apply_rows(logits: Any, bitmask: np.ndarray, logits_rows: Any, bitmask_rows: Any) -> Any:
    """Mask ``logits[logits_rows[i]]`` with ``bitmask[bitmask_rows[i]]``. Our indices select
    the same row of logits and bitmask, so the rows are laid out as tall as the logits; rows
    not named are never read and stay unset."""
    placed = np.empty((int(logits.shape[0]), bitmask.shape[1]), dtype=np.int32)
    placed[logits_rows] = bitmask[bitmask_rows]
    rows = logits_rows.tolist() if isinstance(logits_rows, np.ndarray) else logits_rows
    return apply_token_mask(logits, placed, indices=rows)


def finish_apply(logits: Any, masked: Any, runner: str) -> None:
    """Write ``masked`` back where a platform is not in place (none built in today), and log
    the first apply of each runner with what served it."""
    if masked is not logits:
        logits.copy_(masked)
    first = _first_apply.setdefault(runner, threading.Event())
    if not first.is_set():
        first.set()
        logger.info(
            "portable_guided applied the first grammar bitmask in this process (pid %d, "
            "Model Runner %s): %s", os.getpid(), runner, resolve(logits),
        )
