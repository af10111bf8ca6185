"""Draft tokens for speculative decoding from the sequence itself (prompt lookup / n-gram).

Structured output repeats itself (keys, brackets, quoted values copied from the prompt), so the
tokens that followed the last earlier occurrence of the current suffix are cheap, often-right
guesses. No draft model is needed. Several earlier occurrences with different continuations
make a draft *tree*: one verification forward then tries every branch.

A decode loop keeps one :class:`NgramIndex` per sequence (``NgramDraft.index``) and extends it
with each accepted token, so a proposal costs the same at 1k or 32k tokens of history;
``NgramDraft.propose`` with a whole history scans it (the reference the index is tested against).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass

__all__ = ["DraftTree", "NgramDraft", "NgramIndex"]


@dataclass(frozen=True)
class DraftTree:
    """Draft tokens below the last accepted token (the root, which is not included).

    ``tokens[i]`` continues ``parents[i]``: an earlier index, or -1 for the root. A chain of
    k drafts has ``parents == [-1, 0, 1, ..., k-2]``. Siblings carry different tokens.
    """

    tokens: list[int]
    parents: list[int]

    def __post_init__(self) -> None:
        if len(self.tokens) != len(self.parents):
            raise ValueError(
                f"{len(self.tokens)} tokens but {len(self.parents)} parents"
            )
        bad = [(i, p) for i, p in enumerate(self.parents) if not -1 <= p < i]
        if bad:
            raise ValueError(
                f"each parent must be -1 or an earlier index; got (index, parent) {bad}"
            )

    @classmethod
    def chain(cls, tokens: Sequence[int]) -> DraftTree:
        """A tree with a single branch."""
        return cls([int(t) for t in tokens], list(range(-1, len(tokens) - 1)))

    def __len__(self) -> int:
        return len(self.tokens)

    def links(self) -> tuple[list[int], list[int]]:
        """``(next_token, next_sibling)`` over the nodes ``[root, *tokens]`` (root = 0, token
        ``i`` = node ``i + 1``; -1 for none): the layout of
        :meth:`portable_guided.runtime.Request.fill_draft_tree`."""
        n = len(self.tokens) + 1
        first_child, next_sibling = [-1] * n, [-1] * n
        last_child: dict[int, int] = {}
        for i, p in enumerate(self.parents):
            node, parent = i + 1, p + 1
            if first_child[parent] == -1:
                first_child[parent] = node
            else:
                next_sibling[last_child[parent]] = node
            last_child[parent] = node
        return first_child, next_sibling


class NgramDraft:
    """Propose draft tokens by matching the last ``n`` tokens earlier in the history.

    Tries ``n = max_n`` down to ``min_n``; more recent matches come first.

    Example::

        >>> NgramDraft(max_n=2).propose([5, 6, 7, 8, 5, 6], k=2)
        [7, 8]
        >>> NgramDraft(max_n=1).propose_tree([1, 2, 1, 3, 1], k=3, branches=2)
        DraftTree(tokens=[3, 1, 2], parents=[-1, 0, -1])
    """

    def __init__(self, *, min_n: int = 1, max_n: int = 3) -> None:
        if not 1 <= min_n <= max_n:
            raise ValueError(f"need 1 <= min_n <= max_n, got min_n={min_n}, max_n={max_n}")
        self.min_n, self.max_n = min_n, max_n

    def index(self, tokens: Sequence[int] = ()) -> NgramIndex:
        """An incremental index over ``tokens`` (extend it with each accepted token) that
        proposes exactly what :meth:`propose` and :meth:`propose_tree` would for the same
        history, without scanning it."""
        return NgramIndex(self.min_n, self.max_n, tokens)

    def _continuations(self, history: Sequence[int], k: int) -> Iterator[list[int]]:
        """Continuations of up to ``k`` tokens after earlier occurrences of the history's
        suffix: longest suffix first, then most recent occurrence first."""
        h = list(history)
        size = len(h)
        for n in range(min(self.max_n, size - 1), self.min_n - 1, -1):
            suffix = h[size - n:]
            for start in range(size - n - 1, -1, -1):
                if h[start:start + n] == suffix:
                    yield h[start + n:start + n + k]

    def propose(self, history: Sequence[int], k: int) -> list[int]:
        """Up to ``k`` draft tokens to follow ``history`` (possibly none)."""
        if k <= 0:
            return []
        return next(self._continuations(history, k), [])

    def propose_tree(self, history: Sequence[int], k: int, branches: int) -> DraftTree:
        """A tree of at most ``k`` draft tokens merging up to ``branches`` distinct
        continuations. Its first branch is :meth:`propose`'s chain, so a tree never accepts
        fewer tokens than the chain would."""
        return _merge_tree(self._continuations(history, k), k, branches)


def _merge_tree(continuations: Iterator[list[int]], k: int, branches: int) -> DraftTree:
    """Merge the first ``branches`` distinct continuations into a trie of at most ``k`` nodes."""
    if branches < 1:
        raise ValueError(f"branches must be >= 1, got {branches}")
    tokens: list[int] = []
    parents: list[int] = []
    if k <= 0:
        return DraftTree(tokens, parents)
    children: dict[tuple[int, int], int] = {}  # (parent, token) -> node
    seen: set[tuple[int, ...]] = set()
    for cont in continuations:
        if len(seen) == branches or len(tokens) == k:
            break
        if tuple(cont) in seen:
            continue
        seen.add(tuple(cont))
        node = -1
        for tok in cont:
            nxt = children.get((node, tok))
            if nxt is None:
                if len(tokens) == k:
                    break
                nxt = children[(node, tok)] = len(tokens)
                tokens.append(tok)
                parents.append(node)
            node = nxt
    return DraftTree(tokens, parents)


class NgramIndex:
    """The n-gram matches of one growing token sequence, kept up to date token by token.

    For each ``n`` in ``[min_n, max_n]``, ``_last`` maps an n-gram to the start of its latest
    occurrence and ``_prev[n]`` chains each occurrence to the previous one (hash chains, as
    in LZ77), so the most recent earlier match of the suffix is one dictionary look-up and
    :meth:`extend` costs O(max_n - min_n + 1) per token. Proposals equal
    :meth:`NgramDraft.propose` / :meth:`NgramDraft.propose_tree` on the same tokens.

    Example::

        >>> index = NgramDraft(max_n=2).index([5, 6, 7, 8])
        >>> index.extend([5, 6])
        >>> index.propose(k=2)
        [7, 8]
    """

    def __init__(self, min_n: int, max_n: int, tokens: Sequence[int] = ()) -> None:
        if not 1 <= min_n <= max_n:
            raise ValueError(f"need 1 <= min_n <= max_n, got min_n={min_n}, max_n={max_n}")
        self.min_n, self.max_n = min_n, max_n
        self.tokens: list[int] = []
        # Keys are n-gram tuples; tuples of different lengths never collide.
        self._last: dict[tuple[int, ...], int] = {}
        self._prev: dict[int, list[int]] = {n: [] for n in range(min_n, max_n + 1)}
        self.extend(tokens)

    def __len__(self) -> int:
        return len(self.tokens)

    def extend(self, tokens: Sequence[int]) -> None:
        """Append accepted tokens."""
        h, last = self.tokens, self._last
        for tok in tokens:
            h.append(int(tok))
            end = len(h)
            for n, prev in self._prev.items():
                start = end - n
                if start < 0:
                    continue
                key = tuple(h[start:end])
                # prev[start] = the previous start of the same n-gram (-1: none)
                prev.append(last.get(key, -1))
                last[key] = start

    def _continuations(self, k: int) -> Iterator[list[int]]:
        """As :meth:`NgramDraft._continuations` on :attr:`tokens`, from the chains."""
        h = self.tokens
        size = len(h)
        for n in range(min(self.max_n, size - 1), self.min_n - 1, -1):
            prev = self._prev[n]
            # The suffix itself is the latest occurrence; its chain lists the earlier ones.
            start = prev[size - n]
            while start >= 0:
                yield h[start + n:start + n + k]
                start = prev[start]

    def propose(self, k: int) -> list[int]:
        """Up to ``k`` draft tokens to follow the tokens so far (possibly none)."""
        if k <= 0:
            return []
        return next(self._continuations(k), [])

    def propose_tree(self, k: int, branches: int) -> DraftTree:
        """As :meth:`NgramDraft.propose_tree` on :attr:`tokens`. Scans occurrences only until
        ``branches`` distinct continuations or ``k`` nodes are found, so its cost grows with the
        number of repeated continuations, not with the history."""
        return _merge_tree(self._continuations(k), k, branches)
