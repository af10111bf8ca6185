"""Prompt-lookup drafts: exact proposals on small histories."""

from __future__ import annotations

import pytest

from portable_guided.decode.draft import NgramDraft


@pytest.mark.parametrize(
    ("history", "k", "expected"),
    [
        ([5, 6, 7, 8, 5, 6], 2, [7, 8]),  # 2-gram (5, 6) seen before
        ([5, 6, 7, 8, 5, 6], 9, [7, 8, 5, 6]),  # continuation runs to the end
        ([1, 2, 3], 3, []),  # no earlier match
        ([1, 2, 9, 1, 2, 8, 1, 2], 1, [8]),  # the most recent match wins
        ([4, 4, 4], 4, [4]),
        ([1, 2, 3, 1, 2], 0, []),
    ],
)
def test_proposals(history, k, expected):
    assert NgramDraft(max_n=2).propose(history, k) == expected


def test_longer_ngrams_are_tried_first():
    # 3-gram (1, 2, 3) occurred once, followed by 7; 1-gram (3) most recently by 9.
    h = [1, 2, 3, 7, 0, 3, 9, 1, 2, 3]
    assert NgramDraft(max_n=3).propose(h, 1) == [7]
    assert NgramDraft(min_n=1, max_n=1).propose(h, 1) == [9]


def test_rejects_bad_sizes():
    with pytest.raises(ValueError, match="min_n=3, max_n=2"):
        NgramDraft(min_n=3, max_n=2)
