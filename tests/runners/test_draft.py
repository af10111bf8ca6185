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


def test_tree_merges_continuations_first_branch_is_the_chain():
    from portable_guided.decode.draft import DraftTree

    # The 1-gram (1) was followed by 3 1 (most recent) and by 2 1 3 before.
    h = [1, 2, 1, 3, 1]
    d = NgramDraft(max_n=1)
    assert d.propose(h, 3) == [3, 1]
    tree = d.propose_tree(h, k=4, branches=2)
    assert tree == DraftTree([3, 1, 2, 1], [-1, 0, -1, 2])
    assert tree.tokens[: 2] == d.propose(h, 3)
    assert d.propose_tree(h, k=4, branches=1) == DraftTree.chain([3, 1])
    assert d.propose_tree(h, k=3, branches=2) == DraftTree([3, 1, 2], [-1, 0, -1])  # node cap


def test_tree_shares_common_prefixes():
    # Continuations of (7): [8, 9, 0, 7] (recent) and [8, 5, 0, 7, 8]: one node for the
    # shared 8, then the node budget of 5 cuts the second branch after 5.
    h = [7, 8, 5, 0, 7, 8, 9, 0, 7]
    tree = NgramDraft(max_n=1).propose_tree(h, k=5, branches=3)
    assert tree.tokens == [8, 9, 0, 7, 5]
    assert tree.parents == [-1, 0, 1, 2, 0]


def test_tree_links_follow_the_eagle_layout():
    from portable_guided.decode.draft import DraftTree

    tree = DraftTree([3, 1, 2], [-1, 0, -1])  # root -> 3 -> 1, root -> 2
    assert tree.links() == ([1, 2, -1, -1], [-1, 3, -1, -1])


def test_tree_rejects_bad_parents():
    from portable_guided.decode.draft import DraftTree

    with pytest.raises(ValueError, match=r"\(index, parent\) \[\(1, 1\)\]"):
        DraftTree([1, 2], [-1, 1])
    with pytest.raises(ValueError, match="2 tokens but 1 parents"):
        DraftTree([1, 2], [-1])
    with pytest.raises(ValueError, match="branches must be >= 1, got 0"):
        NgramDraft().propose_tree([1, 2], 2, 0)
