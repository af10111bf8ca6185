"""Requests: error policies, rollback, speculative accept, draft masks and trees,
jump-forward, reasoning phases, tokens accepted before the grammar is ready."""

from __future__ import annotations

import threading

import numpy as np
import pytest
from runtime_helpers import allowed, is_allowed

from portable_guided.runtime import (
    GrammarRejectedToken,
    GrammarSpec,
    ReasoningConfig,
    Request,
)

SCHEMA = GrammarSpec.json_schema({
    "type": "object", "properties": {"name": {"type": "string"}, "n": {"type": "integer"}},
    "required": ["name", "n"], "additionalProperties": False})
TEXT = '{"name": "Ada", "n": 36}'


def mask(rt, req):
    bm = rt.allocate_bitmask(1)
    rt.fill_bitmask([req], bm)
    return bm[0].copy()


def test_raise_policy_fails_closed(rt):
    ids = rt.info.encode(TEXT)
    req = rt.new_request(SCHEMA).wait(60)
    assert req.accept(ids[0])
    bad = rt.info.encode("xyz")[0]
    with pytest.raises(GrammarRejectedToken, match=f"token {bad} rejected .* position 1"):
        req.accept(bad)
    assert req.failed and isinstance(req.error, GrammarRejectedToken)
    # The constraint is never dropped: the row now allows only the stop tokens...
    assert allowed(mask(rt, req), rt.vocab_size).tolist() == [1]
    # ...and the request keeps failing instead of silently accepting anything.
    with pytest.raises(GrammarRejectedToken):
        req.accept(ids[1])


def test_terminate_policy_forces_stop(rt):
    req = rt.new_request(SCHEMA, on_error="terminate").wait(60)
    bad = rt.info.encode("xyz")[0]
    assert req.accept(bad) is False
    assert req.is_terminated and not req.failed
    assert isinstance(req.error, GrammarRejectedToken)
    assert allowed(mask(rt, req), rt.vocab_size).tolist() == [1]
    assert req.accept(1)  # the forced stop token


def test_reject_policy_keeps_state(rt):
    ids = rt.info.encode(TEXT)
    req = rt.new_request(SCHEMA, on_error="reject").wait(60)
    assert req.accept(ids[0])
    before = mask(rt, req)
    assert req.accept(rt.info.encode("xyz")[0]) is False
    assert np.array_equal(mask(rt, req), before) and not req.failed
    for t in ids[1:]:
        assert req.accept(t)
    assert req.accept(1) and req.is_terminated
    assert req.num_rejected == 1


def test_rollback_restores_masks(rt):
    ids = rt.info.encode(TEXT)
    req = rt.new_request(SCHEMA).wait(60)
    masks = []
    for t in ids:
        masks.append(mask(rt, req))
        req.accept(t)
    assert req.accept(1) and req.is_terminated
    req.rollback(1)
    assert not req.is_terminated
    req.rollback(4)
    assert np.array_equal(mask(rt, req), masks[len(ids) - 4])
    with pytest.raises(ValueError, match="cannot roll back 99"):
        req.rollback(99)


def test_accept_tokens_longest_valid_prefix(rt):
    ids = rt.info.encode(TEXT)
    bad = rt.info.encode("xyz")[0]
    req = rt.new_request(SCHEMA).wait(60)
    assert req.accept_tokens(ids[:3] + [bad] + ids[4:]) == 3
    assert not req.failed  # a rejected draft is normal, no policy applies
    assert req.accept_tokens(ids[3:]) == len(ids) - 3
    assert req.accept(1) and req.is_terminated


def test_draft_masks_match_sequential(rt):
    ids = rt.info.encode(TEXT)
    bad = rt.info.encode("xyz")[0]
    req = rt.new_request(SCHEMA).wait(60)
    req.accept_tokens(ids[:2])
    draft = ids[2:6] + [bad, ids[7]]
    bm = rt.allocate_bitmask(len(draft) + 1)
    assert req.fill_draft_masks(draft, bm) == 4
    assert req.num_accepted == 2  # drafts were rolled back
    # Reference: the masks a request sees when it accepts the drafts one by one.
    ref = rt.new_request(SCHEMA).wait(60)
    ref.accept_tokens(ids[:2])
    for j in range(5):
        assert np.array_equal(bm[j], mask(rt, ref)), j
        if j < 4:
            ref.accept(draft[j])
    assert np.array_equal(bm[5], bm[4]) and np.array_equal(bm[6], bm[4])


def test_draft_tree_matches_paths(rt):
    ids = rt.info.encode(TEXT)
    bad = rt.info.encode("xyz")[0]
    req = rt.new_request(SCHEMA).wait(60)
    req.accept(ids[0])
    # Tree: 0 (root) -> 1 (ids[1]) -> 2 (ids[2]); 1 -> 3 (bad, sibling of 2); 0 -> 4 (ids[1]').
    tokens = [ids[0], ids[1], ids[2], bad, bad]
    nxt = [1, 2, -1, -1, -1]
    sib = [-1, 4, 3, -1, -1]
    bm = np.zeros((5, rt.bitmask_words), dtype=np.int32)
    valid = req.fill_draft_tree(nxt, sib, tokens, bm)
    assert valid.tolist() == [True, True, True, False, False]
    for node, path in [(0, []), (1, [ids[1]]), (2, [ids[1], ids[2]])]:
        ref = rt.new_request(SCHEMA).wait(60)
        ref.accept_tokens([ids[0], *path])
        assert np.array_equal(bm[node], mask(rt, ref)), node
    assert not bm[3].any() and not bm[4].any()
    assert req.num_accepted == 1


def test_jump_forward(rt):
    spec = GrammarSpec.json_schema(SCHEMA.payload, any_whitespace=False)
    req = rt.new_request(spec).wait(60)
    forced = req.jump_forward()
    assert forced.startswith('{"name"')  # the only key that may come first
    assert req.accept_tokens(rt.info.encode(forced)) == len(rt.info.encode(forced))
    assert req.jump_forward() in ("", '"', ' "')
    free = rt.new_request(GrammarSpec.regex("[a-z]+")).wait(60)
    assert free.jump_forward() == ""


def test_reasoning_phase_and_budget(rt):
    info = rt.info
    end = info.encode("</think>")
    req = rt.new_request(SCHEMA, reasoning=ReasoningConfig(tuple(end), budget=3)).wait(60)
    words = info.encode(" a b c d e")
    m0 = mask(rt, req)
    assert not is_allowed(m0, 1) and is_allowed(m0, words[0]) and req.is_thinking
    for t in words[:3]:
        assert req.accept(t)
    # Budget spent: the mask forces the think-end sequence token by token.
    for t in end:
        assert allowed(mask(rt, req), rt.vocab_size).tolist() == [t]
        assert req.accept(t)
    assert not req.is_thinking
    ids = info.encode(TEXT)
    assert np.array_equal(mask(rt, req), mask(rt, rt.new_request(SCHEMA).wait(60)))
    assert req.accept_tokens(ids) == len(ids)
    req.rollback(len(ids) + 1)  # back across the boundary
    assert req.is_thinking and allowed(mask(rt, req), rt.vocab_size).tolist() == [end[-1]]


def test_reasoning_without_budget_ends_on_sequence(rt):
    info = rt.info
    end = info.encode("</think>")
    req = rt.new_request(SCHEMA, reasoning=ReasoningConfig(tuple(end))).wait(60)
    req.accept_tokens(info.encode("hmm, so") + end)
    assert not req.is_thinking
    with pytest.raises(GrammarRejectedToken):
        req.accept(info.encode("hmm")[0])


def test_tokens_before_ready_are_replayed(runtimes):
    # Disaggregated prefill: tokens produced elsewhere arrive before the compile finished.
    from test_compile_service import nested_any_of  # a spec that takes about a second

    rt = runtimes["xgrammar"]
    spec = GrammarSpec.json_schema(
        {"type": "object", "properties": {"q": {"const": 17}, "z": nested_any_of(3)}})
    ids = rt.info.encode('{"q": 17')
    req = rt.new_request(spec)
    for t in ids:
        assert req.accept(t)
    assert not req.ready  # the tokens were queued
    req.wait(120)
    assert req.num_accepted == len(ids)
    assert allowed(mask(rt, req), rt.vocab_size).tolist() == allowed(
        mask(rt, _walked(rt, spec, ids)), rt.vocab_size).tolist()
    bad = rt.new_request(GrammarSpec.json_schema({"type": "array", "items": nested_any_of(3)}))
    assert bad.accept(rt.info.encode("{")[0])  # queued: not checked yet
    bad.wait(120)
    assert bad.failed and isinstance(bad.error, GrammarRejectedToken)


def _walked(rt, spec, ids):
    req = rt.new_request(spec).wait(60)
    req.accept_tokens(ids)
    return req


def test_threads_share_requests(rt):
    # Many threads accept and fill concurrently; every request ends in the same state as a
    # single-threaded walk.
    ids = rt.info.encode(TEXT)
    reqs = [rt.new_request(SCHEMA).wait(60) for _ in range(16)]
    bm = rt.allocate_bitmask(16)
    errors = []

    def worker(chunk):
        try:
            for t in ids:
                for r in chunk:
                    r.accept(t)
                rt.fill_bitmask(reqs, bm)
        except Exception as exc:  # noqa: BLE001 - reported by the assertion below
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(reqs[i::4],)) for i in range(4)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert not errors
    rt.fill_bitmask(reqs, bm)
    for r in reqs:
        assert r.num_accepted == len(ids) and r.accept(1) and r.is_terminated


def test_after_termination_one_more_stop_token_then_nothing(rt):
    """A pipelined engine samples a finished row once more: that stop token is accepted;
    anything else, or a third stop token, is rejected."""
    ids = rt.info.encode(TEXT)
    req = rt.new_request(SCHEMA, on_error="reject").wait(60)
    assert req.accept_tokens(ids) == len(ids)
    assert req.accept(1) and req.is_terminated
    assert allowed(mask(rt, req), rt.vocab_size).tolist() == [1]  # only the stop token
    assert req.accept(ids[0]) is False
    assert req.accept(1) is True
    assert req.accept(1) is False
    assert req.is_terminated and not req.failed


def test_ready_callbacks_run_once_after_the_compile(rt):
    """``add_ready_callback``: a pending request calls back once, when its compile ends
    (after ``ready`` and ``failed`` are final); a ready one calls back at once; a failing
    callback is logged and the others still run."""
    from concurrent.futures import Future

    compiled = rt.compile(SCHEMA)
    pending: Future = Future()
    req = Request(pending, rt._request_context)
    seen: list[tuple[str, bool, bool, int]] = []

    def broken(r):
        raise RuntimeError("a caller's bug")

    req.add_ready_callback(lambda r: seen.append(("first", r.ready, r.failed, r.num_accepted)))
    req.add_ready_callback(broken)
    req.add_ready_callback(lambda r: seen.append(("second", r.ready, r.failed, r.num_accepted)))
    assert seen == [] and not req.ready
    pending.set_result(compiled)
    assert seen == [("first", True, False, 0), ("second", True, False, 0)]
    req.add_ready_callback(lambda r: seen.append(("late", r.ready, r.failed, 0)))
    assert seen[-1] == ("late", True, False, 0) and len(seen) == 3
    with pytest.raises(TypeError, match="callable"):
        req.add_ready_callback("not a function")

    failing: Future = Future()
    bad = Request(failing, rt._request_context)
    errors: list[BaseException | None] = []
    bad.add_ready_callback(lambda r: errors.append(r.error if r.failed else None))
    failing.set_exception(ValueError("no grammar"))
    assert len(errors) == 1 and isinstance(errors[0], ValueError)


def test_ready_callback_added_while_the_compile_ends_runs_once(rt):
    """Callbacks added from another thread while compiles end: each runs exactly once."""
    from concurrent.futures import Future

    compiled = rt.compile(SCHEMA)
    for _ in range(50):
        pending: Future = Future()
        req = Request(pending, rt._request_context)
        calls: list[int] = []

        def add(req: Request = req, calls: list[int] = calls) -> None:
            for i in range(20):
                req.add_ready_callback(lambda r, i=i: calls.append(i))

        adder = threading.Thread(target=add)
        adder.start()
        pending.set_result(compiled)
        adder.join()
        assert sorted(calls) == list(range(20))
