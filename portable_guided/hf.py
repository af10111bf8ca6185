"""Guided decoding for ``transformers``' ``generate``: a logits processor.

:class:`GuidedLogitsProcessor` keeps one runtime request per batch row, accepts the token each
row generated at the previous step, fills the rows' bitmask with the runtime's batch fill and
masks the scores with :func:`portable_guided.apply_token_mask`, so it works on whatever device
and dtype the model runs. Rows whose grammar has finished allow only the stop tokens, which is
what ``generate`` pads finished rows with.

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

    ``specs`` is one :class:`~portable_guided.runtime.GrammarSpec` for every row, or one per
    row (``None`` for an unconstrained row). Beam search is not supported (rows are assumed to
    be independent sequences). A processor serves one ``generate`` call; make a new one per
    call. Rejected tokens follow the runtime's ``on_error`` policy.
    """

    def __init__(self, runtime: Any, specs: Any, *, on_error: str = "raise") -> None:
        self.runtime = runtime
        self._specs = specs
        self._on_error = on_error
        self._requests: list[Any] | None = None
        self._prompt_len: int | None = None
        self._bitmask: np.ndarray | None = None

    @property
    def requests(self) -> list[Any]:
        """The runtime requests, one per row (after the first call)."""
        return list(self._requests or [])

    def _start(self, batch: int) -> None:
        specs: Sequence[Any]
        if isinstance(self._specs, (list, tuple)):
            if len(self._specs) != batch:
                raise ValueError(f"{len(self._specs)} grammar specs for a batch of {batch} rows")
            specs = self._specs
        else:
            specs = [self._specs] * batch
        self._requests = [
            None if s is None else self.runtime.new_request(s, on_error=self._on_error)
            for s in specs
        ]
        for r in self._requests:
            if r is not None:
                r.wait()
                if r.failed:
                    raise r.error
        self._bitmask = self.runtime.allocate_bitmask(batch)

    def __call__(self, input_ids: Any, scores: Any) -> Any:
        """Accept each row's last token (after the first step) and mask ``scores``."""
        from portable_guided import apply_token_mask

        batch, length = int(input_ids.shape[0]), int(input_ids.shape[1])
        if self._requests is None:
            self._start(batch)
            self._prompt_len = length
        elif len(self._requests) != batch:
            raise ValueError(f"batch changed from {len(self._requests)} to {batch} rows")
        elif length > self._prompt_len:  # type: ignore[operator]
            last = input_ids[:, -1].tolist()
            for req, tok in zip(self._requests, last):
                if req is not None and not req.is_terminated:
                    req.accept(int(tok))
        assert self._bitmask is not None
        self.runtime.fill_bitmask(self._requests, self._bitmask)
        if all(r is None for r in self._requests):
            return scores
        return apply_token_mask(scores, self._bitmask, vocab_size=self.runtime.vocab_size)
