"""Bitmask rows that no grammar engine fills, and the checks on a caller's bitmask.

A failed or terminated request allows only the stop tokens; a request in its reasoning phase
allows everything but the stop tokens, or exactly one token when the reasoning budget forces
the end of thinking. These rows depend only on the tokenizer, so one :class:`SpecialRows`
is built per runtime and shared by its requests.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable
from typing import Any

import numpy as np

from .tokenizer_info import TokenizerInfo

__all__ = ["LIVE_WORDS_MAX", "SpecialRows", "as_numpy_bitmask", "live_words"]

#: At most this many words in :attr:`SpecialRows.live_words` (byte-level BPE vocabularies
#: put the 95 characters in 3 to 5 words).
LIVE_WORDS_MAX = 8


class SpecialRows:
    """The precomputed rows for one tokenizer (int32 words, bit ``t`` allows token ``t``).

    Attributes:
        vocab_size: the model's vocabulary width (valid token ids are ``0..vocab_size-1``).
        words: int32 words per row (``ceil(vocab_size / 32)``).
        stop_token_ids: the tokens a finished, failed or terminated request may emit.
        stop_only: only the stop tokens allowed.
        all_but_stop: every token of the tokenizer but the stop tokens (the reasoning phase).
        live_words: the words holding the tokens of single printable ASCII characters, the
            fullest first (at most :data:`LIVE_WORDS_MAX`). A JSON mask allows one of them at
            nearly every step, so reading these few words tells a live row from a dead end
            (all zeros) without a pass over the row; only when all are 0 is the row counted.
    """

    def __init__(self, info: TokenizerInfo) -> None:
        self.vocab_size = info.vocab_size
        self.words = info.bitmask_words
        self.stop_token_ids = info.stop_token_ids
        self.stop_only = self.row_of(info.stop_token_ids)
        valid = np.zeros(self.words * 32, dtype=np.uint8)
        valid[: info.tokenizer_vocab_size] = 1
        valid[list(info.stop_token_ids)] = 0
        self.all_but_stop = np.packbits(valid, bitorder="little").view(np.int32).copy()
        self.live_words = live_words(info)
        self._single: dict[int, np.ndarray] = {}
        self._lock = threading.Lock()

    def row_of(self, token_ids: Iterable[int]) -> np.ndarray:
        """A row allowing exactly ``token_ids``."""
        bits = np.zeros(self.words * 32, dtype=np.uint8)
        bits[list(token_ids)] = 1
        return np.packbits(bits, bitorder="little").view(np.int32).copy()

    def only(self, token_id: int) -> np.ndarray:
        """A row allowing exactly ``token_id`` (cached: forced think-end tokens repeat)."""
        with self._lock:
            row = self._single.get(token_id)
            if row is None:
                row = self._single[token_id] = self.row_of([token_id])
            return row

    def write(self, bitmask: Any, row: int, values: np.ndarray) -> None:
        """``bitmask[row] = values`` for a NumPy array or a CPU Torch tensor."""
        if isinstance(bitmask, np.ndarray):
            bitmask[row] = values
        else:
            as_numpy_bitmask(bitmask, self.words)[row] = values


def live_words(info: TokenizerInfo) -> tuple[int, ...]:
    """The bitmask words (indices) holding the tokens of single printable ASCII characters
    (each character encoded alone, where that gives one token), the fullest first, at most
    :data:`LIVE_WORDS_MAX`; empty if no character is a token of its own."""
    counts: dict[int, int] = {}
    for code in range(0x20, 0x7F):
        ids = info.encode(chr(code))
        if len(ids) == 1 and 0 <= ids[0] < info.vocab_size:
            counts[ids[0] >> 5] = counts.get(ids[0] >> 5, 0) + 1
    ranked = sorted(counts, key=lambda word: (-counts[word], word))
    return tuple(ranked[:LIVE_WORDS_MAX])


def as_numpy_bitmask(bitmask: Any, words: int) -> np.ndarray:
    """A NumPy view of ``bitmask`` (a NumPy array or a CPU Torch tensor, shared memory),
    checked to be C-contiguous int32 of shape ``(rows, words)``."""
    if isinstance(bitmask, np.ndarray):
        arr = bitmask
    elif hasattr(bitmask, "numpy") and hasattr(bitmask, "device"):
        if bitmask.device.type != "cpu":
            raise ValueError(f"the bitmask must be on the CPU, got device {bitmask.device}")
        arr = bitmask.numpy()  # shares memory with the tensor
    else:
        raise TypeError(f"bitmask must be a NumPy array or a CPU Torch tensor, got {type(bitmask)}")
    if arr.dtype != np.int32 or arr.ndim != 2 or arr.shape[1] != words:
        raise ValueError(
            f"bitmask must be int32 of shape (rows, {words}), got {arr.dtype} {arr.shape}"
        )
    if not arr.flags["C_CONTIGUOUS"]:
        raise ValueError("bitmask must be C-contiguous")
    return arr
