"""Batched mask filling with row indices, mixed with unconstrained/prefill/failed rows."""

from __future__ import annotations

import numpy as np
import pytest
from runtime_helpers import allowed

from portable_guided.runtime import GrammarSpec

SPECS = [
    GrammarSpec.json_schema({"type": "object", "properties": {"a": {"type": "integer"}}}),
    GrammarSpec.regex(r"(ab|cd)+[0-9]"),
    GrammarSpec.choice(["left", "right"]),
    GrammarSpec.json_schema({"type": "array", "items": {"type": "string"}}),
]
PREFIXES = ['{"a": 1', "abcd", "righ", '["x", "']


def _requests(rt, n):
    """``n`` requests past their second token, so that the engine fills each row (a request
    at its grammar's start or one token in gets a copy of a mask computed with the compile:
    test_first_mask.py)."""
    reqs = []
    for i in range(n):
        req = rt.new_request(SPECS[i % 4]).wait(60)
        chars = [t for c in PREFIXES[i % 4] for t in rt.info.encode(c)]  # a token a character
        assert req.accept_tokens(chars[: 2 + i % 3]) == 2 + i % 3
        reqs.append(req)
    return reqs


def test_batch_equals_single_fills(rt):
    reqs = _requests(rt, 24)
    batch = np.zeros((24, rt.bitmask_words), dtype=np.int32)
    rt.fill_bitmask(reqs, batch)
    for i, req in enumerate(reqs):
        single = rt.allocate_bitmask(1)
        req.fill(single, 0)
        assert np.array_equal(batch[i], single[0]), i


def test_rows_mix_constrained_and_unconstrained(rt):
    reqs = _requests(rt, 6)
    failed = rt.new_request(GrammarSpec.ebnf('root ::= "a" nope')).wait(60)
    prefill = rt.new_request(SPECS[0]).wait(60)
    prefill.in_prefill = True
    batch = [reqs[0], None, reqs[1], failed, prefill, None, *reqs[2:]]
    rows = [9, 0, 3, 5, 7, 1, 2, 4, 6, 8]
    bm = np.zeros((11, rt.bitmask_words), dtype=np.int32)
    bm[7] = 12345  # the prefill row is skipped: left exactly as it was
    rt.fill_bitmask(batch, bm, rows=rows)
    assert (bm[0] == -1).all() and (bm[1] == -1).all()  # unconstrained: all allowed
    assert allowed(bm[5], rt.vocab_size).tolist() == list(rt.info.stop_token_ids)
    assert (bm[7] == 12345).all()
    assert not bm[10].any()  # a row no request names is not touched
    for req, row in [(reqs[0], 9), (reqs[1], 3), (reqs[2], 2), (reqs[5], 8)]:
        single = rt.allocate_bitmask(1)
        req.fill(single, 0)
        assert np.array_equal(bm[row], single[0])


def test_torch_bitmask(rt):
    torch = pytest.importorskip("torch")
    reqs = _requests(rt, 4)
    bm = torch.zeros((4, rt.bitmask_words), dtype=torch.int32)
    rt.fill_bitmask(reqs, bm)
    ref = rt.allocate_bitmask(4)
    rt.fill_bitmask(reqs, ref)
    assert np.array_equal(bm.numpy(), ref)


def test_bad_bitmask_and_rows(rt):
    reqs = _requests(rt, 2)
    with pytest.raises(ValueError, match=r"int32 of shape \(rows, 4042\), got int64"):
        rt.fill_bitmask(reqs, np.zeros((2, rt.bitmask_words), dtype=np.int64))
    with pytest.raises(ValueError, match="shape"):
        rt.fill_bitmask(reqs, np.zeros((2, 7), dtype=np.int32))
    bm = rt.allocate_bitmask(2)
    with pytest.raises(ValueError, match=r"rows \[5\] out of range"):
        rt.fill_bitmask(reqs, bm, rows=[0, 5])
    with pytest.raises(ValueError, match="duplicates"):
        rt.fill_bitmask(reqs, bm, rows=[1, 1])
    with pytest.raises(ValueError, match="3 requests but the bitmask has only 2 rows"):
        rt.fill_bitmask([*reqs, None], bm)
    with pytest.raises(TypeError, match="NumPy array or a CPU Torch tensor"):
        rt.fill_bitmask(reqs, [[0]])


def test_a_reused_buffer_is_still_checked_row_by_row(rt):
    """``Request.fill`` checks a NumPy buffer once, then only the row: a row out of range,
    a row of the wrong type or another buffer of a bad shape still raise on a buffer it
    has filled before, and the masks match a fresh buffer's."""
    req, = _requests(rt, 1)
    bm = rt.allocate_bitmask(2)
    req.fill(bm, 1)
    req.fill(bm, 0)  # (the checked buffer again)
    fresh = rt.allocate_bitmask(1)
    req.fill(fresh, 0)
    assert np.array_equal(bm[0], fresh[0]) and np.array_equal(bm[1], fresh[0])
    with pytest.raises(ValueError, match="row 2 out of range for a bitmask of 2 rows"):
        req.fill(bm, 2)
    with pytest.raises(ValueError, match="row -1 out of range"):
        req.fill(bm, -1)
    with pytest.raises(TypeError, match="row must be an int, got bool"):
        req.fill(bm, True)
    with pytest.raises(ValueError, match="shape"):
        req.fill(np.zeros((2, 7), dtype=np.int32), 0)
    with pytest.raises(ValueError, match="got int64"):
        req.fill(np.zeros((2, rt.bitmask_words), dtype=np.int64), 0)



def test_a_reused_tensor_is_checked_again_once_changed(rt):
    """A CPU tensor can take other storage or another shape under the same object (``set_``,
    ``resize_``): the fill then checks it again instead of writing through the old view."""
    torch = pytest.importorskip("torch")
    req, = _requests(rt, 1)
    bm = torch.zeros((2, rt.bitmask_words), dtype=torch.int32)
    req.fill(bm, 1)
    ref = rt.allocate_bitmask(1)
    req.fill(ref, 0)
    bm.set_(torch.zeros((64, rt.bitmask_words), dtype=torch.int32))  # (other storage)
    req.fill(bm, 63)
    assert np.array_equal(bm[63].numpy(), ref[0]) and not bm[1].any()
    bm.resize_(1, rt.bitmask_words)  # (the same storage, one row)
    with pytest.raises(ValueError, match="row 1 out of range for a bitmask of 1 rows"):
        req.fill(bm, 1)


def test_threaded_and_inline_paths_agree(deepseek):
    # parallel_fill_min_us=0 always hands rows to the engine's threads; a huge threshold
    # always fills inline. Both must write identical masks.
    from portable_guided.runtime import GrammarRuntime

    out = []
    for engine in ("xgrammar", "llguidance"):
        for threshold in (0.0, 1e12):
            with GrammarRuntime(deepseek, engine, compile_timeout_s=None, fill_threads=2,
                                parallel_fill_min_us=threshold) as rt:
                reqs = _requests(rt, 12)
                bm = np.zeros((12, rt.bitmask_words), dtype=np.int32)
                rt.fill_bitmask(reqs, bm)
                rt.fill_bitmask(reqs, bm)  # the second step uses the measured row cost
                out.append(bm)
    assert np.array_equal(out[0], out[1]) and np.array_equal(out[2], out[3])


def _contract_fill(requests, bitmask):
    """A batching loop an engine could write itself, from the public batch contract only."""
    jobs = {}
    ordered = sorted(enumerate(requests), key=lambda item: item[1].serial)
    locks = [req.fill_lock for _, req in ordered]
    for lock in locks:
        lock.acquire()
    try:
        for row, req in ordered:
            matcher = req.fill_target(bitmask, row)
            if matcher is not None:
                jobs.setdefault(id(req.engine), (req.engine, []))[1].append((matcher, row))
        for engine, pairs in jobs.values():
            engine.fill_batch([m for m, _ in pairs], bitmask, [r for _, r in pairs])
    finally:
        for lock in locks:
            lock.release()


def test_the_batch_contract_is_enough_for_an_engine_loop(rt):
    """A loop written against the public contract (serial, fill_lock, fill_target, engine)
    fills exactly what fill_bitmask fills, failed and thinking rows included."""
    from portable_guided.runtime import ReasoningConfig

    reqs = _requests(rt, 6)
    failed = rt.new_request(GrammarSpec.ebnf('root ::= "a" nope')).wait(60)
    thinking = rt.new_request(SPECS[2], reasoning=ReasoningConfig((7, 8), budget=1)).wait(60)
    thinking.accept(5)  # one thinking token: the budget now forces token 7
    batch = [*reqs, failed, thinking]
    expected = np.zeros((len(batch), rt.bitmask_words), dtype=np.int32)
    rt.fill_bitmask(batch, expected)
    got = np.zeros_like(expected)
    _contract_fill(batch, got)
    assert np.array_equal(got, expected)
    assert allowed(got[-1], rt.vocab_size).tolist() == [7]
    assert allowed(got[-2], rt.vocab_size).tolist() == list(rt.info.stop_token_ids)


@pytest.mark.parametrize("engine", ["xgrammar", "llguidance"])
def test_a_cheap_step_is_one_library_call_per_engine(deepseek, engine, monkeypatch):
    """Below the threading threshold the rows of one engine are filled by a single
    ``fill_chunk`` call (no Python per row), with the same masks as single fills, and each
    request gets a share of the chunk's time as its cost."""
    from portable_guided.runtime import GrammarRuntime

    with GrammarRuntime(deepseek, engine, compile_timeout_s=None, fill_threads=2,
                        parallel_fill_min_us=1e9) as rt:
        reqs = _requests(rt, 8)
        cls = type(reqs[0].engine)
        calls = []
        real = cls.fill_chunk
        monkeypatch.setattr(cls, "fill_chunk", lambda self, matchers, bitmask, rows: (
            calls.append(list(rows)), real(self, matchers, bitmask, rows)))
        bm = np.zeros((9, rt.bitmask_words), dtype=np.int32)
        rt.fill_bitmask([*reqs[:4], None, *reqs[4:]], bm)
        assert calls == [[0, 1, 2, 3, 5, 6, 7, 8]]
        for row, req in zip([0, 1, 2, 3, 5, 6, 7, 8], reqs):
            single = rt.allocate_bitmask(1)
            req.fill(single, 0)
            assert np.array_equal(bm[row], single[0]), row
        assert (bm[4] == -1).all()
        assert all(req.fill_cost_s > 0 for req in reqs)
