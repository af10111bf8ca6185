"""Draft tokens for speculative decoding from the sequence itself (prompt lookup / n-gram).

Structured output repeats itself (keys, brackets, quoted values copied from the prompt), so the
tokens that followed the last earlier occurrence of the current suffix are cheap, often-right
guesses. No draft model is needed.
"""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["NgramDraft"]


class NgramDraft:
    """Propose up to ``k`` tokens by matching the last ``n`` tokens earlier in the history.

    Tries ``n = max_n`` down to ``min_n`` and uses the most recent earlier match.

    Example::

        >>> NgramDraft(max_n=2).propose([5, 6, 7, 8, 5, 6], k=2)
        [7, 8]
    """

    def __init__(self, *, min_n: int = 1, max_n: int = 3) -> None:
        if not 1 <= min_n <= max_n:
            raise ValueError(f"need 1 <= min_n <= max_n, got min_n={min_n}, max_n={max_n}")
        self.min_n, self.max_n = min_n, max_n

    def propose(self, history: Sequence[int], k: int) -> list[int]:
        """Up to ``k`` draft tokens to follow ``history`` (possibly none)."""
        if k <= 0:
            return []
        h = list(history)
        size = len(h)
        for n in range(min(self.max_n, size - 1), self.min_n - 1, -1):
            suffix = h[size - n:]
            # Most recent earlier occurrence whose continuation exists.
            for start in range(size - n - 1, -1, -1):
                if h[start:start + n] == suffix:
                    return h[start + n:start + n + k]
        return []
