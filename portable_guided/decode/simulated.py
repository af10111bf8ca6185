"""A simulated accelerator: a forward that takes a fixed time and leaves the CPU free.

:class:`SimulatedRunner` implements the :class:`~portable_guided.decode.device.Runner` protocol
with a one-thread executor standing in for a CUDA stream: every operation is queued and
returns at once (a future plays the device tensor), the forward sleeps ``forward_s`` (sleeping
releases the CPU, like a GPU kernel), and masking and sampling run for real on NumPy logits
(``apply_token_mask``, argmax). It measures how much grammar work an engine leaves visible,
without a GPU and without the CPU-bound forward of a real model competing for 2 cores.

Logits are drawn from a fixed pool by (input token, position), so runs are reproducible, each
step differs, and a sequence's tokens do not depend on its batch neighbours or slot; the masked
argmax is a grammar-valid but arbitrary token.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import numpy as np

from portable_guided.decode.device import SamplingParams, SlotLengths, tree_layout

__all__ = ["SimulatedRunner"]


class _Copy:
    """A pending device-to-host copy: waits on the stream's future only."""

    __slots__ = ("_fut",)

    def __init__(self, fut: Future) -> None:
        self._fut = fut

    def wait(self) -> np.ndarray:
        return self._fut.result()


class SimulatedRunner(SlotLengths):
    """A runner whose forward takes ``forward_s`` seconds of device time.

    Example::

        runner = SimulatedRunner(vocab_size=49152, eos_token_id=2, forward_s=0.02)
        Generator(runner, runtime=rt).generate(requests)
    """

    framework = "simulated"
    prefers_overlap = True  # the forward leaves the CPU free, like an accelerator

    def __init__(
        self, vocab_size: int, eos_token_id: int, forward_s: float, *, pool_rows: int = 64,
        seed: int = 0,
    ) -> None:
        if forward_s < 0:
            raise ValueError(f"forward_s must be >= 0, got {forward_s}")
        self.vocab_size = vocab_size
        self.eos_token_id = eos_token_id
        self.forward_s = forward_s
        rng = np.random.default_rng(seed)
        self._pool = rng.standard_normal((pool_rows, vocab_size), dtype=np.float32)
        self._stream = ThreadPoolExecutor(1, thread_name_prefix="pg-sim-device")
        self._lengths: dict[int, int] = {}
        self._uploads: dict[int, Future] = {}
        self._rng = np.random.default_rng(seed)

    def close(self) -> None:
        """Stop the device thread."""
        self._stream.shutdown(wait=True)

    # -- KV cache bookkeeping (host side, as in the real runners) --------------------------
    def reset(self, max_slots: int, max_len: int) -> None:
        """See :meth:`Runner.reset`."""
        self._lengths = {}
        self._rng = np.random.default_rng(0)


    def forward(
        self, slots: Sequence[int], tokens: Any, counts: Sequence[int] | None = None, *,
        all_positions: bool = False, parents: Sequence[Sequence[int]] | None = None,
    ) -> Future:
        """Queue a forward of ``forward_s``. Token values are read on the device thread (no
        host sync); the logits depend only on (token, position), not on slot or batch (a
        tree token's position is its depth)."""
        width = 1 if isinstance(tokens, Future) else np.asarray(tokens).shape[1]
        counts = [width] * len(slots) if counts is None else list(counts)
        depth = (tree_layout(parents, counts, width)[0] if parents is not None
                 else np.tile(np.arange(width), (len(slots), 1)))
        cells = []  # (row, column of tokens, position) per logits row
        for row, (s, c) in enumerate(zip(slots, counts)):
            start = self._lengths.get(s, 0)
            cols = range(c) if all_positions or parents is not None else [c - 1]
            cells += [(row, j, start + int(depth[row, j])) for j in cols]
            self._lengths[s] = start + c
        return self._stream.submit(self._forward, tokens, cells)

    def _forward(self, tokens: Any, cells: list[tuple[int, int, int]]) -> np.ndarray:
        t0 = time.perf_counter()
        ids = tokens.result() if isinstance(tokens, Future) else np.asarray(tokens)
        ids = ids.reshape(len(ids), -1)
        pick = [(int(ids[r, j]) * 7919 + p * 104729) % self._pool.shape[0] for r, j, p in cells]
        logits = self._pool[pick]  # a fresh copy, masked in place later
        left = self.forward_s - (time.perf_counter() - t0)
        if left > 0:
            time.sleep(left)
        return logits

    def _move_cache_rows(self, slot: int, src: list[int], dst: list[int]) -> None:
        """Nothing to move: the simulated device keeps no keys or values."""

    # -- device ops -----------------------------------------------------------------------
    def host_buffer(self, shape: tuple[int, ...]) -> np.ndarray:
        """See :meth:`Runner.host_buffer`."""
        return np.empty(shape, dtype=np.int32)

    def upload_bitmask(self, host_bitmask: np.ndarray) -> Future:
        """Queue a copy of the bitmask (the host buffer is read on the device thread)."""
        fut = self._stream.submit(np.array, host_bitmask, copy=True)
        self._uploads[host_bitmask.ctypes.data] = fut
        return fut

    def host_bitmask_ready(self, host_bitmask: np.ndarray) -> None:
        """See :meth:`Runner.host_bitmask_ready`."""
        fut = self._uploads.pop(host_bitmask.ctypes.data, None)
        if fut is not None:
            fut.result()

    def apply_mask(self, logits: Future, bitmask: Future) -> Future:
        """Queue ``apply_token_mask`` on the NumPy logits."""
        from portable_guided import apply_token_mask

        return self._stream.submit(
            lambda: apply_token_mask(logits.result(), bitmask.result(), vocab_size=self.vocab_size)
        )

    def sample(self, logits: Future, params: SamplingParams) -> Future:
        """Queue greedy or temperature sampling."""
        return self._stream.submit(self._sample, logits, params)

    def _sample(self, logits: Future, params: SamplingParams) -> np.ndarray:
        x = logits.result()
        if params.greedy:
            return x.argmax(axis=-1)
        z = (x - x.max(axis=-1, keepdims=True)) / params.temperature
        p = np.exp(z)
        p /= p.sum(axis=-1, keepdims=True)
        u = self._rng.random((x.shape[0], 1))
        return (p.cumsum(axis=-1) < u).sum(axis=-1).clip(max=x.shape[1] - 1)

    def select(self, tokens: Future, rows: Sequence[int]) -> Future:
        """See :meth:`Runner.select`."""
        idx = list(rows)
        return self._stream.submit(lambda: tokens.result()[idx])

    def concat(self, parts: Sequence[Future]) -> Future:
        """See :meth:`Runner.concat`."""
        if len(parts) == 1:
            return parts[0]
        return self._stream.submit(lambda: np.concatenate([p.result() for p in parts]))

    def to_host(self, tokens: Future) -> _Copy:
        """See :meth:`Runner.to_host`."""
        return _Copy(tokens)
