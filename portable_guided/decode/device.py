"""The framework-neutral contract between the decode loop and a model runner.

The loop never touches a framework: it holds *device tokens* and *logits* as opaque handles and
asks the runner to move them. Every call may be asynchronous (CUDA streams, the simulated
device), so the loop's order of calls is the only synchronization: a host value appears only
through :meth:`Runner.to_host`, whose :class:`Pending` is waited on by the CPU worker, never by a
device-wide synchronize.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

if TYPE_CHECKING:
    import numpy as np

__all__ = ["Pending", "Ready", "Runner", "SamplingParams", "SlotLengths", "tree_layout"]


@dataclass(frozen=True)
class SamplingParams:
    """How to pick a token from masked logits.

    ``temperature == 0`` is greedy (argmax). Otherwise softmax at ``temperature``, restricted to
    the smallest set of tokens whose probability reaches ``top_p``, sampled with a generator
    seeded by ``seed`` (reproducible for one runner, batch and device).
    """

    temperature: float = 0.0
    top_p: float = 1.0
    seed: int = 0

    def __post_init__(self) -> None:
        if not self.temperature >= 0.0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature!r}")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p!r}")

    @property
    def greedy(self) -> bool:
        """True when decoding is argmax."""
        return self.temperature == 0.0


@runtime_checkable
class Pending(Protocol):
    """A device-to-host copy in flight; :meth:`wait` blocks on its event only."""

    def wait(self) -> np.ndarray:
        """Block until the copy landed and return the host array."""
        ...


class Ready:
    """A :class:`Pending` that is already complete (CPU devices)."""

    __slots__ = ("_value",)

    def __init__(self, value: np.ndarray) -> None:
        self._value = value

    def wait(self) -> np.ndarray:
        """Return the value."""
        return self._value


class SlotLengths:
    """Host-side count of the tokens each KV-cache slot holds; shared by the runners."""

    _lengths: dict[int, int]

    def length(self, slot: int) -> int:
        """Number of tokens cached for ``slot``."""
        return self._lengths.get(slot, 0)

    def truncate(self, slot: int, length: int) -> None:
        """Forget the tokens of ``slot`` past ``length`` (rollback after rejected drafts)."""
        if not 0 <= length <= self._lengths.get(slot, 0):
            raise ValueError(
                f"cannot truncate slot {slot} of length {self._lengths.get(slot, 0)} to {length}"
            )
        self._lengths[slot] = length

    def retain(self, slot: int, start: int, nodes: Sequence[int]) -> None:
        """Keep the tokens appended at ``start`` whose indices are ``nodes`` (an accepted path
        of a draft tree, increasing), moved to positions ``start, start + 1, ...``; forget
        the rest. For a chain (``nodes == [0, 1, ..., n-1]``) nothing moves."""
        nodes = [int(n) for n in nodes]
        have = self._lengths.get(slot, 0) - start
        if start < 0 or any(not 0 <= n < have for n in nodes) or nodes != sorted(set(nodes)):
            raise ValueError(
                f"cannot retain nodes {nodes} of slot {slot}: {have} tokens from {start}"
            )
        moved = [(start + n, start + i) for i, n in enumerate(nodes) if n != i]
        if moved:
            src, dst = zip(*moved)
            self._move_cache_rows(slot, list(src), list(dst))
        self._lengths[slot] = start + len(nodes)

    def _move_cache_rows(self, slot: int, src: list[int], dst: list[int]) -> None:
        """Copy the cached keys and values of ``slot`` at positions ``src`` to ``dst``."""
        raise NotImplementedError(f"{type(self).__name__} cannot move cache rows")


def tree_layout(
    parents: Sequence[Sequence[int]], counts: Sequence[int], width: int
) -> tuple[np.ndarray, np.ndarray]:
    """Host arrays for a tree forward: ``depth`` ``[B, width]`` (int64) and ``ancestors``
    ``[B, width, width]`` (bool, ``ancestors[b, j, i]``: token ``i`` is ``j`` or one of its
    ancestors). Padding tokens (``j >= counts[b]``) see only themselves, at depth ``j``."""
    import numpy as np

    b = len(counts)
    if len(parents) != b:
        raise ValueError(f"parents has {len(parents)} rows for {b} token rows")
    depth = np.tile(np.arange(width, dtype=np.int64), (b, 1))
    anc = np.zeros((b, width, width), dtype=bool)
    anc[:, np.arange(width), np.arange(width)] = True
    for r, (par, c) in enumerate(zip(parents, counts)):
        par = [int(p) for p in par]
        if len(par) != c or (c and par[0] != -1) or any(not 0 <= p < j for j, p in
                                                          enumerate(par) if j):
            raise ValueError(
                f"row {r}: parents must have {c} entries, -1 first, then earlier indices; "
                f"got {par}"
            )
        for j in range(1, c):
            depth[r, j] = depth[r, par[j]] + 1
            anc[r, j] |= anc[r, par[j]]
    return depth, anc


@runtime_checkable
class Runner(Protocol):
    """What :class:`portable_guided.decode.engine.Generator` needs from a model runner.

    A runner owns a slot-based KV cache: each live sequence has a slot and a length, so sequences
    join, finish and roll back independently.
    """

    vocab_size: int
    eos_token_id: int
    #: Optional (default True): whether grammar work should overlap the forward. False for a
    #: forward that runs on the host CPU, where both would compete for the same cores.
    prefers_overlap: bool

    def reset(self, max_slots: int, max_len: int) -> None:
        """(Re)allocate the KV cache for ``max_slots`` sequences of up to ``max_len`` tokens
        and restart sampling from its seed."""
        ...

    def forward(
        self,
        slots: Sequence[int],
        tokens: Any,
        counts: Sequence[int] | None = None,
        *,
        all_positions: bool = False,
        parents: Sequence[Sequence[int]] | None = None,
    ) -> Any:
        """Append ``tokens`` to the cache of each slot and return logits.

        ``tokens`` is either a host int array ``[B, T]`` whose row ``i`` has ``counts[i]`` valid
        tokens (the rest padding), or device tokens from :meth:`sample` (one per row). Returns
        logits ``[B, vocab]`` at each row's last valid token, or with ``all_positions`` the
        logits of every valid token, rows concatenated (``[sum(counts), vocab]``).

        ``parents`` makes each row a token tree (speculative draft trees; implies
        ``all_positions``): ``parents[i][j]`` is the index of token ``j``'s parent in row
        ``i`` (``-1`` for token 0, the root; otherwise ``< j``). A token sees the cache and
        its ancestors only, at position ``start + depth``; follow with :meth:`retain`.
        """
        ...

    def retain(self, slot: int, start: int, nodes: Sequence[int]) -> None:
        """Keep the path ``nodes`` of a tree appended at ``start`` (see
        :meth:`SlotLengths.retain`)."""
        ...

    def length(self, slot: int) -> int:
        """Number of tokens cached for ``slot``."""
        ...

    def truncate(self, slot: int, length: int) -> None:
        """Roll ``slot`` back to its first ``length`` tokens (speculative rejection)."""
        ...

    def upload_bitmask(self, host_bitmask: np.ndarray) -> Any:
        """Start a non-blocking copy of an int32 bitmask to the device and return it there."""
        ...

    def host_bitmask_ready(self, host_bitmask: np.ndarray) -> None:
        """Block until the last upload of ``host_bitmask`` no longer reads it (reuse guard)."""
        ...

    def host_buffer(self, shape: tuple[int, ...]) -> np.ndarray:
        """An int32 host buffer for bitmasks (page-locked where the device benefits)."""
        ...

    def apply_mask(self, logits: Any, bitmask: Any) -> Any:
        """Mask ``logits`` in place with a device bitmask of the same row count."""
        ...

    def sample(self, logits: Any, params: SamplingParams) -> Any:
        """Pick one token per logits row; returns device tokens."""
        ...

    def select(self, tokens: Any, rows: Sequence[int]) -> Any:
        """Device tokens of ``rows`` (in that order)."""
        ...

    def concat(self, parts: Sequence[Any]) -> Any:
        """Concatenate device token vectors."""
        ...

    def to_host(self, tokens: Any) -> Pending:
        """Start a non-blocking copy of device tokens to the host."""
        ...
