"""Guided decoding for ``transformers``' ``generate``: a logits processor.

:class:`GuidedLogitsProcessor` keeps one runtime request per batch row, accepts the token each
row generated at the previous step, fills the rows' bitmask with the runtime's batch fill and
masks the scores with :func:`portable_guided.apply_token_mask`, so it works on whatever device
and dtype the model runs. Rows whose grammar has finished allow only the stop tokens, which is
what ``generate`` pads finished rows with.

Beam search reorders and duplicates rows between steps, so a row's grammar state is found by
its generated tokens rather than by its index: each row continues the request of a previous
row whose tokens are its own minus the last one; when two rows continue the same parent, the
second gets a fresh request (a compile-cache hit) replayed to that prefix.

Example::

    from portable_guided.hf import GuidedLogitsProcessor
    from portable_guided.runtime import GrammarRuntime, GrammarSpec

    rt = GrammarRuntime("smollm2")
    proc = GuidedLogitsProcessor(rt, GrammarSpec.json_schema(schema))
    out = model.generate(input_ids, logits_processor=[proc], max_new_tokens=128)
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

__all__ = ["GuidedLogitsProcessor"]


class GuidedLogitsProcessor:
    """A ``transformers`` logits processor backed by the runtime and ``apply_token_mask``.

    ``specs`` is one :class:`~portable_guided.runtime.GrammarSpec` for every row, or a list
    with one per input sequence (``None`` for unconstrained); with beam search or
    ``num_return_sequences`` each spec covers its sequence's consecutive expanded rows. Greedy,
    sampling and beam search all work. A processor serves one ``generate`` call; make a new
    one per call. Rejected tokens follow the runtime's ``on_error`` policy.
    """

    def __init__(self, runtime: Any, specs: Any, *, on_error: str = "raise") -> None:
        self.runtime = runtime
        self._specs = specs
        self._on_error = on_error
        self._requests: list[Any] | None = None
        self._row_specs: list[Any] = []
        self._generated: list[tuple[int, ...]] = []
        self._prompt_len = 0
        self._bitmask: np.ndarray | None = None

    @property
    def requests(self) -> list[Any]:
        """The runtime requests, one per row (after the first call)."""
        return list(self._requests or [])

    def _start(self, batch: int, length: int) -> None:
        if isinstance(self._specs, (list, tuple)):
            n = len(self._specs)
            if n == 0 or batch % n:
                raise ValueError(f"{n} grammar specs for a batch of {batch} rows")
            self._row_specs = [self._specs[i // (batch // n)] for i in range(batch)]
        else:
            self._row_specs = [self._specs] * batch
        self._requests = [self._new_request(s) for s in self._row_specs]
        self._generated = [()] * batch
        self._prompt_len = length
        self._bitmask = self.runtime.allocate_bitmask(batch)

    def _new_request(self, spec: Any) -> Any:
        if spec is None:
            return None
        req = self.runtime.new_request(spec, on_error=self._on_error).wait()
        if req.failed:
            raise req.error
        return req

    @staticmethod
    def _feed(req: Any, tokens: Sequence[int]) -> None:
        for tok in tokens:
            if req.is_terminated:  # generate pads finished rows; the grammar is done
                return
            req.accept(int(tok))

    def _advance(self, generated: list[tuple[int, ...]]) -> None:
        """Give each row the request of the previous row it continues, then its new token."""
        assert self._requests is not None
        parents: dict[tuple[int, tuple[int, ...]], list[Any]] = {}
        for spec, gen, req in zip(self._row_specs, self._generated, self._requests):
            parents.setdefault((id(spec), gen), []).append(req)
        requests = []
        for spec, gen in zip(self._row_specs, generated):
            free = parents.get((id(spec), gen[:-1]))
            if free:
                req = free.pop()
            else:  # a second child of one parent (beam search): replay the prefix
                req = self._new_request(spec)
                if req is not None:
                    self._feed(req, gen[:-1])
            if req is not None:
                self._feed(req, gen[-1:])
            requests.append(req)
        self._requests, self._generated = requests, generated

    def __call__(self, input_ids: Any, scores: Any) -> Any:
        """Accept each row's last token (after the first step) and mask ``scores``."""
        from portable_guided import apply_token_mask

        batch, length = int(input_ids.shape[0]), int(input_ids.shape[1])
        if self._requests is None:
            self._start(batch, length)
        elif len(self._requests) != batch:
            raise ValueError(f"batch changed from {len(self._requests)} to {batch} rows")
        elif length > self._prompt_len:
            rows = input_ids[:, self._prompt_len:].tolist()
            self._advance([tuple(int(t) for t in r) for r in rows])
        assert self._bitmask is not None and self._requests is not None  # set by _start
        self.runtime.fill_bitmask(self._requests, self._bitmask)
        if all(r is None for r in self._requests):
            return scores
        return apply_token_mask(scores, self._bitmask, vocab_size=self.runtime.vocab_size)
