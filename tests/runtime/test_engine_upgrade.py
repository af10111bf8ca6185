"""Engine upgrades (``CompileService(upgrade=True)``, the runtime's default under ``auto``): a
JSON schema llguidance compiled is compiled with xgrammar in the background as soon as it
is ready; later requests get xgrammar's grammar, which decides texts as the first did, and
running requests move to it as it lands, or at their next mask (hand-over: its masks equal a
fresh xgrammar matcher's fed the same tokens); a schema xgrammar refuses keeps llguidance's; background
jobs never hold a worker slot (they run at the long lane's priority)."""

from __future__ import annotations

import hashlib
import os
import sys
import threading
import time

import numpy as np
import pytest
from runtime_helpers import decide_text

from portable_guided.runtime import GrammarRuntime, GrammarSpec, request
from portable_guided.runtime import compile_service as service
from portable_guided.runtime.compile_service import UPGRADE_ENGINE

# Compiled by llguidance first under auto; xgrammar compiles it too.
SCHEMA = {"type": "object", "properties": {"n": {"type": "integer", "minimum": 3},
                                           "s": {"type": "string", "maxLength": 4}},
          "required": ["n"], "additionalProperties": False}
TEXTS = {'{"n": 3}': True, '{"n": 7, "s": "abcd"}': True, '{"n": 2}': False,
         '{"n": 3, "s": "abcde"}': False, '{"n": 3, "x": 1}': False, '{"s": "a"}': False}


def _settled(rt: GrammarRuntime, spec: GrammarSpec, timeout_s: float = 60.0) -> str | None:
    deadline = time.monotonic() + timeout_s
    while rt.upgrade_state(spec) == "running" and time.monotonic() < deadline:
        time.sleep(0.02)
    return rt.upgrade_state(spec)


@pytest.fixture(scope="module")
def info():
    from portable_guided.runtime import load_tokenizer_info

    return load_tokenizer_info("smollm2")


@pytest.fixture
def rt(info):
    with GrammarRuntime(info, "auto", compile_timeout_s=20) as made:
        yield made


def test_a_new_schema_moves_to_xgrammar_and_decides_alike(rt):
    spec = GrammarSpec.json_schema(SCHEMA)
    first = rt.compile(spec)
    assert first.engine_name == "llguidance"
    # The upgrade starts with the first compile, not the first repeat.
    assert rt.upgrade_state(spec) in ("running", "done")
    running = rt.new_request(spec).wait(60)  # (on llguidance's grammar, unless it landed)
    head = rt.info.encode('{"n": 5')
    assert running.accept_tokens(head) == len(head)
    assert _settled(rt, spec) == "done"
    upgraded = rt.compile(spec)
    assert upgraded.engine_name == UPGRADE_ENGINE and upgraded.source == "upgrade"
    assert first.upgraded is upgraded
    assert {text: decide_text(rt, SCHEMA, text) for text in TEXTS} == TEXTS
    # The request made before has moved over (as the upgrade landed) and goes on.
    running.fill(rt.allocate_bitmask(1), 0)
    assert running.engine_name == UPGRADE_ENGINE
    tail = rt.info.encode("}")
    assert running.accept_tokens(tail) == len(tail)
    assert running.accept(rt.info.stop_token_ids[0]) and running.is_terminated
    assert rt.metrics()["upgrades"] == 1 and rt.metrics()["upgrade_failures"] == 0


def test_the_upgrade_is_queued_before_the_compile_resolves(rt, monkeypatch):
    """A caller woken by the compile already reads "running": a server (or a benchmark)
    that paces its steps by the upgrade's state never sees it not started yet."""
    spec = GrammarSpec.json_schema({"type": "object", "properties": {"q": {"type": "string"}},
                                    "required": ["q"]})
    seen = []
    real = service._resolve

    def spy(fut, outcome):
        if getattr(outcome, "engine_name", None) == "llguidance":
            seen.append(rt.upgrade_state(spec))
        real(fut, outcome)

    monkeypatch.setattr(service, "_resolve", spy)
    assert rt.compile(spec).engine_name == "llguidance"
    assert seen == ["running"]


def test_an_upgrade_done_before_the_first_compile_is_attached_when_it_is_delivered(
        rt, monkeypatch):
    """The upgrade starts with the submission, beside the first compile: one that compiled
    first waits for that compile and is attached to it (its requests move at their second
    mask, later ones get it)."""
    spec = GrammarSpec.json_schema(SCHEMA)
    real = service.CompileService._settle

    def late(self, key, spec_, fut, result, errors):
        def settle_once_the_upgrade_waits():
            deadline = time.monotonic() + 60
            while key not in self._early_upgrades and time.monotonic() < deadline:
                time.sleep(0.01)
            real(self, key, spec_, fut, result, errors)

        threading.Thread(target=settle_once_the_upgrade_waits, daemon=True).start()

    monkeypatch.setattr(service.CompileService, "_settle", late)
    first = rt.compile(spec, timeout=60)
    monkeypatch.undo()
    assert first.engine_name == "llguidance"
    assert first.upgraded is not None and first.upgraded.engine_name == UPGRADE_ENGINE
    assert rt.upgrade_state(spec) == "done" and not rt._service._early_upgrades
    assert rt.compile(spec) is first.upgraded
    assert {text: decide_text(rt, SCHEMA, text) for text in TEXTS} == TEXTS
    assert rt.metrics()["upgrades"] == 1 and rt.metrics()["upgrades_dropped"] == 0


def _llguidance_and_upgrade(info, schema):
    """A runtime without upgrades (its grammar for ``schema`` is llguidance's) and that
    grammar with ``upgraded`` set to xgrammar's, compiled by a second runtime: hand-overs
    happen exactly when the test says."""
    spec = GrammarSpec.json_schema(schema)
    rt = GrammarRuntime(info, "auto", compile_timeout_s=20, engine_upgrade=False)
    xrt = GrammarRuntime(info, "xgrammar", compile_timeout_s=20)
    compiled = rt.compile(spec)
    assert compiled.engine_name == "llguidance"
    return rt, xrt, spec, compiled, xrt.compile(spec)


def _mask_after(rt, req):
    bm = rt.allocate_bitmask(1)
    req.fill(bm, 0)
    return bm[0].copy()


def test_a_running_request_moves_with_its_tokens_and_rollback_history(info):
    rt, xrt, spec, compiled, upgraded = _llguidance_and_upgrade(info, SCHEMA)
    with rt, xrt:
        ids = info.encode('{"n": 5, "s": "ab')
        req = rt.new_request(spec).wait(60)
        assert req.accept_tokens(ids) == len(ids)
        req.rollback(1)
        _mask_after(rt, req)
        assert req.engine_name == "llguidance"  # nothing to move to yet
        compiled.upgraded = upgraded
        moved = _mask_after(rt, req)
        assert req.engine_name == UPGRADE_ENGINE and rt.metrics()["handovers"] == 1
        # The reference: a fresh xgrammar request fed the same tokens.
        ref = xrt.new_request(spec).wait(60)
        assert ref.accept_tokens(ids[:-1]) == len(ids) - 1
        np.testing.assert_array_equal(moved, _mask_after(xrt, ref))
        # Its history moved too: the rollback reaches back past the hand-over.
        req.rollback(len(ids) - 1)
        ref.rollback(len(ids) - 1)
        np.testing.assert_array_equal(_mask_after(rt, req), _mask_after(xrt, ref))
        rest = info.encode('{"n": 3}')
        assert req.accept_tokens(rest) == len(rest) and req.accept(info.stop_token_ids[0])


def test_a_batch_fill_moves_its_requests_and_fills_them_with_the_new_engine(info):
    rt, xrt, spec, compiled, upgraded = _llguidance_and_upgrade(info, SCHEMA)
    with rt, xrt:
        texts = ['{"n": 5', '{"n": 5, "s": "a']
        reqs = [rt.new_request(spec).wait(60) for _ in texts]
        refs = [xrt.new_request(spec).wait(60) for _ in texts]
        for text, req, ref in zip(texts, reqs, refs, strict=True):
            ids = info.encode(text)
            assert req.accept_tokens(ids) == ref.accept_tokens(ids) == len(ids)
        compiled.upgraded = upgraded
        got, want = rt.allocate_bitmask(2), xrt.allocate_bitmask(2)
        rt.fill_bitmask(reqs, got)  # (grouped by engine after the move)
        xrt.fill_bitmask(refs, want)
        assert [r.engine_name for r in reqs] == [UPGRADE_ENGINE] * 2
        np.testing.assert_array_equal(got, want)


def test_the_upgrade_moves_its_running_requests_when_it_lands(rt, monkeypatch):
    """The upgrade's thread moves the requests on the old grammar as it lands: they are on
    xgrammar before their next mask (which then pays no move), with the masks of a fresh
    xgrammar request fed the same tokens; one past the token cap stays."""
    monkeypatch.setattr(request, "HANDOVER_MAX_TOKENS", 11)
    gate = threading.Event()
    real = service._recompile_checked
    monkeypatch.setattr(service, "_recompile_checked",
                        lambda *args: (gate.wait(30), real(*args))[1])
    spec = GrammarSpec.json_schema(SCHEMA)
    assert rt.compile(spec).engine_name == "llguidance"
    texts = ['{"n": 5', '{"n": 5, "s": "a', '{"n": 5, "s": "ab"}']
    reqs = [rt.new_request(spec).wait(60) for _ in texts]
    for text, req in zip(texts, reqs, strict=True):
        ids = rt.info.encode(text)
        assert req.accept_tokens(ids) == len(ids)
    assert len(rt.info.encode(texts[1])) <= 11 < len(rt.info.encode(texts[2]))
    assert [r.engine_name for r in reqs] == ["llguidance"] * 3
    gate.set()
    assert _settled(rt, spec) == "done"
    assert [r.engine_name for r in reqs] == [UPGRADE_ENGINE] * 2 + ["llguidance"]
    assert rt.metrics()["handovers"] == 2
    with GrammarRuntime(rt.info, "xgrammar", compile_timeout_s=20) as xrt:
        for text, req in zip(texts[:2], reqs[:2], strict=True):
            ref = xrt.new_request(spec).wait(60)
            assert ref.accept_tokens(rt.info.encode(text)) == len(rt.info.encode(text))
            np.testing.assert_array_equal(_mask_after(rt, req), _mask_after(xrt, ref))


def test_a_request_past_the_token_cap_keeps_its_grammar(info, monkeypatch):
    monkeypatch.setattr(request, "HANDOVER_MAX_TOKENS", 2)
    rt, xrt, spec, compiled, upgraded = _llguidance_and_upgrade(info, SCHEMA)
    with rt, xrt:
        ids = info.encode('{"n": 5')
        assert len(ids) > 2
        long, short = rt.new_request(spec).wait(60), rt.new_request(spec).wait(60)
        assert long.accept_tokens(ids) == len(ids)
        assert short.accept_tokens(ids[:2]) == 2
        compiled.upgraded = upgraded
        _mask_after(rt, long)
        _mask_after(rt, short)
        assert long.engine_name == "llguidance" and short.engine_name == UPGRADE_ENGINE
        assert long.accept_tokens(info.encode("}")) and long.accept(info.stop_token_ids[0])


def test_a_token_the_upgraded_engine_rejects_keeps_the_grammar(info):
    # A documented subset: a pattern's \s is any whitespace on llguidance, a space only on
    # xgrammar. A request that wrote a tab stays on llguidance; one that wrote a space moves.
    schema = {"type": "string", "pattern": "^a\\sb$"}
    rt, xrt, spec, compiled, upgraded = _llguidance_and_upgrade(info, schema)
    with rt, xrt:
        tab, space = rt.new_request(spec).wait(60), rt.new_request(spec).wait(60)
        tab_ids, space_ids = info.encode('"a\\t'), info.encode('"a ')
        assert tab.accept_tokens(tab_ids) == len(tab_ids)
        assert space.accept_tokens(space_ids) == len(space_ids)
        compiled.upgraded = upgraded
        _mask_after(rt, tab)
        _mask_after(rt, space)
        assert tab.engine_name == "llguidance" and space.engine_name == UPGRADE_ENGINE
        assert rt.metrics()["handovers_failed"] == 1 and rt.metrics()["handovers"] == 1
        for req in (tab, space):
            end = info.encode('b"')
            assert req.accept_tokens(end) == len(end) and req.accept(info.stop_token_ids[0])


def test_no_hand_over_where_each_engine_has_its_own_layout(rt):
    # Without free whitespace xgrammar writes `", "` and `": "`, llguidance neither: a request
    # moved mid-text would mix them. Later requests still get xgrammar's grammar.
    spec = GrammarSpec.json_schema(SCHEMA, any_whitespace=False)
    first = rt.compile(spec)
    assert first.engine_name == "llguidance"
    assert _settled(rt, spec) == "done"
    assert first.upgraded is None and rt.compile(spec).engine_name == UPGRADE_ENGINE


def test_a_full_upgrade_queue_leaves_the_schema_to_a_later_request(rt, monkeypatch):
    spec = GrammarSpec.json_schema(SCHEMA)
    monkeypatch.setattr(service, "UPGRADES_QUEUED_MAX", 0)
    rt.compile(spec)
    assert rt.upgrade_state(spec) is None
    monkeypatch.setattr(service, "UPGRADES_QUEUED_MAX", 32)
    rt.compile(spec)  # a memory hit tries again
    assert _settled(rt, spec) == "done"


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="a thread's own nice value")
def test_the_upgrade_compiles_in_this_process_at_low_priority(rt):
    before = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
    spec = GrammarSpec.json_schema(SCHEMA)
    rt.compile(spec)
    assert _settled(rt, spec) == "done"
    upgraders = [t for t in threading.enumerate() if t.name.startswith("pg-upgrade")]
    assert upgraders and all(os.getpriority(os.PRIO_PROCESS, t.native_id) >= 10
                             for t in upgraders)
    # Only that thread: the caller's priority is unchanged.
    assert os.getpriority(os.PRIO_PROCESS, threading.get_native_id()) == before


def test_a_schema_xgrammar_refuses_keeps_its_grammar_and_is_tried_once(rt):
    # xgrammar drops length bounds beside a pattern: refused there, llguidance enforces it.
    schema = {"type": "string", "pattern": "^a+$", "maxLength": 3}
    spec = GrammarSpec.json_schema(schema)
    rt.compile(spec)
    assert _settled(rt, spec) == "failed"
    for _ in range(3):
        assert rt.compile(spec).engine_name == "llguidance"
    assert rt.metrics()["upgrade_failures"] == 1 and rt.metrics()["upgrades"] == 0
    assert decide_text(rt, schema, '"aaa"') is True
    assert decide_text(rt, schema, '"aaaa"') is False


def test_no_upgrade_when_off_or_not_auto(info):
    spec = GrammarSpec.json_schema(SCHEMA)
    with GrammarRuntime(info, "auto", compile_timeout_s=20, engine_upgrade=False) as off:
        off.compile(spec)
        off.compile(spec)
        assert off.upgrade_state(spec) is None
    with GrammarRuntime(info, "llguidance", compile_timeout_s=20) as fixed:
        fixed.compile(spec)
        fixed.compile(spec)
        assert fixed.upgrade_state(spec) is None
    with GrammarRuntime(info, "auto", compile_timeout_s=20) as rt:
        other = GrammarSpec.regex("[a-z]+")  # JSON schemas only: one language on each engine
        rt.compile(other)
        rt.compile(other)
        assert rt.upgrade_state(other) is None


@pytest.mark.skipif(not hasattr(os, "getpriority"), reason="reads process priorities")
def test_a_background_job_runs_at_low_priority_and_holds_no_slot(info):
    from portable_guided.runtime.engines import engine_class
    from portable_guided.runtime.worker import WorkerPool

    pool = WorkerPool(lambda: {"xgrammar": engine_class("xgrammar").tokenizer_payload(info)},
                      size=1, spares=1)
    try:
        pool.run("xgrammar", GrammarSpec.regex("a").to_dict(), 60)  # started and warm
        finished: list[str] = []
        slow = GrammarSpec.choice([f"s{i}" for i in range(100_000)]).to_dict()  # seconds
        pool.submit("xgrammar", slow, 60, "never", lambda _: finished.append("background"),
                    background=True)
        deadline = time.monotonic() + 10
        while not pool.busy_pids() and time.monotonic() < deadline:
            time.sleep(0.01)
        (busy,) = pool.busy_pids()
        assert os.getpriority(os.PRIO_PROCESS, busy) >= 10
        # A foreground compile does not wait for it: the normal slot is free.
        assert pool.run("xgrammar", GrammarSpec.regex("b+").to_dict(), 60)[0] == "ok"
        assert finished == [], "the foreground compile waited for the background one"
    finally:
        pool.close()


@pytest.mark.skipif(not hasattr(os, "getpriority"), reason="reads process priorities")
def test_background_jobs_reuse_one_kept_low_priority_worker(info):
    # Retiring the worker after each background job made every compile after an upgrade
    # run on a just-forked worker (about 3x slower): one niced worker is kept for them.
    from portable_guided.runtime.engines import engine_class
    from portable_guided.runtime.worker import WorkerPool

    pool = WorkerPool(lambda: {"xgrammar": engine_class("xgrammar").tokenizer_payload(info)},
                      size=1, spares=1)

    def settled_pids(n: int) -> list[int]:
        deadline = time.monotonic() + 60
        while len(pool.pids()) != n and time.monotonic() < deadline:
            time.sleep(0.01)
        return sorted(pool.pids())

    try:
        pool.run("xgrammar", GrammarSpec.regex("a").to_dict(), 60)  # started and warm
        ran_on = []
        for i in range(2):
            done: list[object] = []
            spec = GrammarSpec.choice([f"s{i}-{j}" for j in range(20_000)]).to_dict()
            pool.submit("xgrammar", spec, 60, "never", done.append, background=True)
            deadline = time.monotonic() + 30
            while not pool.busy_pids() and not done and time.monotonic() < deadline:
                time.sleep(0.001)
            ran_on.extend(pool.busy_pids())
            while not done and time.monotonic() < deadline:
                time.sleep(0.01)
            assert done and done[0][0] == "ok", done
        assert len(ran_on) == 2 and ran_on[0] == ran_on[1], ran_on
        # The two regular workers (one forked to replace the one the first job took) and
        # the kept one, at its lowered priority.
        pids = settled_pids(3)
        assert [p for p in pids if os.getpriority(os.PRIO_PROCESS, p) >= 10] == [ran_on[0]]
        # Foreground compiles never run on it.
        assert pool.run("xgrammar", GrammarSpec.regex("b+").to_dict(), 60)[0] == "ok"
        assert sorted(pool.pids()) == pids
    finally:
        pool.close()


@pytest.mark.skipif(not hasattr(os, "getpriority"), reason="reads process priorities")
def test_a_long_foreground_compiles_worker_is_retired_not_kept(info):
    # Only a worker that ran a background job is kept: one a long foreground compile moved
    # to the long lane may hold that compile's memory.
    from portable_guided.runtime.engines import engine_class
    from portable_guided.runtime.worker import WorkerPool

    pool = WorkerPool(lambda: {"xgrammar": engine_class("xgrammar").tokenizer_payload(info)},
                      size=1, spares=1, long_after_s=0.05)
    try:
        pool.run("xgrammar", GrammarSpec.regex("a").to_dict(), 60)  # started and warm
        done: list[object] = []
        slow = GrammarSpec.choice([f"long-{j}" for j in range(20_000)]).to_dict()
        pool.submit("xgrammar", slow, 60, "never", done.append)
        # Waiting behind it moves it to the long lane.
        assert pool.run("xgrammar", GrammarSpec.regex("b+").to_dict(), 60)[0] == "ok"
        deadline = time.monotonic() + 60
        while not done and time.monotonic() < deadline:
            time.sleep(0.01)
        assert done and done[0][0] == "ok", done
        deadline = time.monotonic() + 30
        while len(pool.pids()) != 2 and time.monotonic() < deadline:
            time.sleep(0.01)
        pids = pool.pids()
        assert len(pids) == 2 and all(os.getpriority(os.PRIO_PROCESS, p) < 10 for p in pids)
    finally:
        pool.close()


def _open_object(names: int, prefix: str) -> dict:
    """An open object of ``names`` long declared names: xgrammar's exact grammar for it
    (a free name must spell none of them) takes it about a second to compile as xgrammar
    writes it (:func:`_xgrammars_own_free_names`)."""
    # (No two names share a suffix: xgrammar compiles a state of a shared one once.)
    return {"type": "object", "properties": {
        hashlib.sha256(f"{prefix}{i}".encode()).hexdigest()[:24]: {"type": "integer"}
        for i in range(names)}}


def _xgrammars_own_free_names(monkeypatch) -> None:
    """Compiles in this process write open objects as xgrammar does, one vocabulary walk
    per prefix of a declared name (the slow compile a test needs; a worker's do not)."""
    from portable_guided.runtime.engines import xgrammar

    monkeypatch.setattr(xgrammar, "share_free_name_tails", lambda text: text)


def test_a_worker_asked_to_prepare_checks_the_spec_and_compiles_nothing(info):
    from portable_guided.runtime.engines import engine_class
    from portable_guided.runtime.engines.xgrammar import XGrammarEngine
    from portable_guided.runtime.worker import WorkerPool

    pool = WorkerPool(lambda: {"xgrammar": engine_class("xgrammar").tokenizer_payload(info)},
                      size=1)
    try:
        spec = GrammarSpec.json_schema(_open_object(12, "p"))
        status, text, prepare_s = pool.run("xgrammar", spec.to_dict(), 60, "prepare")
        assert status == "ok"
        assert tuple(text["prepared"]) == XGrammarEngine.create(info).prepare(spec)
        status, _, compile_s = pool.run("xgrammar", spec.to_dict(), 60, "prepared")
        assert status == "ok" and prepare_s * 10 < compile_s, (prepare_s, compile_s)
        # The checks still run: a spec xgrammar cannot enforce is refused.
        refused = GrammarSpec.json_schema({"type": "string", "pattern": "^a+$", "maxLength": 3})
        assert pool.run("xgrammar", refused.to_dict(), 60, "prepare")[0] == "unsupported"
        with pytest.raises(ValueError, match="serialize must be one of"):
            pool.run("xgrammar", spec.to_dict(), 60, "prepare-only")
    finally:
        pool.close()


def test_an_upgrade_compile_past_its_limit_is_left_running_and_the_next_uses_a_worker(
        info, monkeypatch):
    """An upgrade compiles here once; one past UPGRADE_LIMIT_S fails the upgrade at the
    limit (it cannot be killed here: it is left to finish), and until it ends the next
    upgrades compile in a worker first (which can be killed)."""
    monkeypatch.setattr(service, "UPGRADE_LIMIT_S", 0.3)
    _xgrammars_own_free_names(monkeypatch)
    with GrammarRuntime(info, "auto", compile_timeout_s=20) as rt:
        pool = rt._service._pool
        asked: list[str] = []
        real_run = pool.run

        def spy(engine, spec_dict, timeout_s, serialize="auto", **kw):
            if kw.get("background"):
                asked.append(serialize)
            return real_run(engine, spec_dict, timeout_s, serialize, **kw)

        monkeypatch.setattr(pool, "run", spy)
        slow = GrammarSpec.json_schema(_open_object(16, "slow"))
        rt.compile(slow)
        assert _settled(rt, slow) == "failed"
        runaway = rt._service._upgrade_runaway
        assert runaway is not None and not runaway.done(), "failed only once it had ended"
        spec = GrammarSpec.json_schema(SCHEMA)
        rt.compile(spec)
        assert _settled(rt, spec) == "done"
        assert not runaway.done(), "the slow compile ended first: the test proves nothing"
        assert asked == ["prepare", "prepared"]
        runaway.result(timeout=120)
        after = GrammarSpec.json_schema({**SCHEMA, "required": ["n", "s"]})
        rt.compile(after)
        assert _settled(rt, after) == "done" and asked[-1] == "prepare"
        assert decide_text(rt, SCHEMA, '{"n": 3, "x": 1}') is False
        assert rt.metrics()["upgrade_failures"] == 1 and rt.metrics()["upgrades"] == 2
