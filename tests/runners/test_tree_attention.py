"""Draft-tree forwards of both runners against the same tokens run as plain chains.

A token in a tree must see exactly the cache and its ancestors, at the position of its depth;
after :meth:`retain` keeps one path, the cache must be the one that path alone would have left.
"""

from __future__ import annotations

import numpy as np
import pytest

from tests.support import padded_rows

pytestmark = [pytest.mark.model]

RUNNERS = [
    pytest.param("torch_runner", marks=pytest.mark.torch, id="torch"),
    pytest.param("paddle_runner", marks=[pytest.mark.paddle, pytest.mark.torch], id="paddle"),
]
ATOL = 2e-4  # the same float32 forward over different batch shapes

# Nodes: 0 root, 1 a, 2 b (a's child), 3 c (a's child), 4 d (c's child), 5 e (root's child).
PARENTS = [-1, 0, 1, 1, 3, 0]
BRANCHES = [[0, 1, 2], [0, 1, 3, 4], [0, 5]]


def _chain_logits(runner, slot: int, prefix: list[int], tokens: list[int]) -> np.ndarray:
    runner.truncate(slot, 0)
    runner.forward([slot], np.array([prefix]))
    return runner.forward([slot], np.array([tokens]), all_positions=True).cpu().numpy()


@pytest.mark.parametrize("name", RUNNERS)
def test_tree_forward_equals_each_branch_as_a_chain(request, name, tokenizer):
    runner = request.getfixturevalue(name)
    prompt = tokenizer("The quick brown fox")["input_ids"]
    other = tokenizer("Once upon a time, in a land far away")["input_ids"]
    words = tokenizer(" jumps over the lazy dog")["input_ids"]
    tree = [prompt[-1], *words[:5]]
    runner.reset(4, 64)
    # Two rows of different cache lengths and token counts in one forward: a tree and a pair.
    runner.forward([1, 3], *padded_rows([prompt[:-1], other[:-1]]))
    start = runner.length(1)
    ids, counts = padded_rows([tree, [other[-1], words[0]]])
    logits = runner.forward([1, 3], ids, counts, parents=[PARENTS, [-1, 0]]).cpu().numpy()
    assert logits.shape[0] == 6 + 2
    assert runner.length(1) == start + 6

    for path in BRANCHES:
        ref = _chain_logits(runner, 2, prompt[:-1], [tree[n] for n in path])
        np.testing.assert_allclose(logits[path], ref, atol=ATOL, rtol=0)
    ref = _chain_logits(runner, 0, other[:-1], [other[-1], words[0]])
    np.testing.assert_allclose(logits[6:], ref, atol=ATOL, rtol=0)

    # Keep the path root -> a -> c -> d: the cache must equal that chain's.
    runner.retain(1, start, [0, 1, 3, 4])
    assert runner.length(1) == start + 4
    nxt = runner.forward([1], np.array([[words[0]]])).cpu().numpy()
    ref = _chain_logits(runner, 2, prompt[:-1], [tree[0], tree[1], tree[3], tree[4], words[0]])
    np.testing.assert_allclose(nxt[0], ref[-1], atol=ATOL, rtol=0)


@pytest.mark.parametrize("name", RUNNERS)
def test_tree_forward_rejects_bad_parents(request, name):
    runner = request.getfixturevalue(name)
    runner.reset(2, 16)
    with pytest.raises(ValueError, match="row 0: parents must have 3 entries"):
        runner.forward([0], np.zeros((1, 3), dtype=np.int64), parents=[[-1, 0, 2]])
    runner.forward([0], np.zeros((1, 3), dtype=np.int64))
    with pytest.raises(ValueError, match=r"cannot retain nodes \[0, 2, 1\] of slot 0"):
        runner.retain(0, 0, [0, 2, 1])
