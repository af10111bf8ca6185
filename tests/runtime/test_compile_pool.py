"""The compile worker pool's reader: one thread for every reply, messages read whole."""

from __future__ import annotations

import os
import select
import threading
from multiprocessing.connection import Connection

import pytest

from portable_guided.runtime import GrammarRuntime, GrammarSpec
from portable_guided.runtime.worker import _read_message


@pytest.mark.parametrize("size", [0, 100, 16_000, 20_000, 300_000])
def test_a_reply_is_read_whole_as_connection_sends_it(size):
    r, w = os.pipe()
    sender = Connection(w, readable=False)
    message = (7, ("ok", "x" * size, 0.5))
    thread = threading.Thread(target=sender.send, args=(message,))
    thread.start()
    try:
        select.select([r], [], [], 30)  # as the pool's reader: read once the selector says
        assert _read_message(r) == message
    finally:
        thread.join()
        sender.close()
        os.close(r)


def test_a_closed_pipe_reads_as_eof():
    r, w = os.pipe()
    os.write(w, b"\x00\x00")  # a torn length
    os.close(w)
    with pytest.raises(EOFError):
        _read_message(r)
    os.close(r)


def test_a_burst_of_misses_waits_in_no_thread_per_compile(deepseek):
    """Thirty compiles at once: the pool's reader waits for all of them and finishes each
    fast one itself (no compile thread blocked per job, no hand-over to another thread),
    and every one is served."""
    readers_before = _readers()
    with GrammarRuntime(deepseek, "xgrammar", compile_timeout_s=60, compile_workers=1) as rt:
        assert not rt.new_request(GrammarSpec.regex("a+")).wait(120).failed
        finished_in: list[str] = []
        requests = [rt.new_request(GrammarSpec.regex(f"q{i}[ab]+")) for i in range(30)]
        for request in requests:
            request.add_ready_callback(
                lambda _: finished_in.append(threading.current_thread().name))
        assert all(not r.wait(120).failed for r in requests)
        # The first few may be ready before their callback is added (called here then).
        assert finished_in.count("pg-compile-reader") >= 20, finished_in
        assert set(finished_in) <= {"pg-compile-reader", threading.current_thread().name}
        assert _readers() == readers_before + 1  # one for the runtime (others: fixtures')


def _readers() -> int:
    return sum(t.name == "pg-compile-reader" for t in threading.enumerate())


def test_a_fast_json_compile_is_redone_here_without_the_checks(deepseek):
    """The worker sends back what the engine's ``prepare`` gave it (lowered text, every
    check passed): this process only compiles it (its own ``prepare`` is never called),
    and the grammar masks exactly as one compiled here from the spec."""
    import numpy as np

    schema = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}
    with GrammarRuntime(deepseek, "xgrammar", compile_timeout_s=60) as rt:
        assert not rt.new_request(GrammarSpec.regex("a+")).wait(120).failed  # engine built
        engine = rt._service.engine("xgrammar")

        def not_here(spec):
            raise AssertionError("prepare ran in the parent")

        engine.prepare = not_here
        req = rt.new_request(GrammarSpec.json_schema(schema)).wait(120)
        assert not req.failed, req.error
        del engine.prepare
        compiled = rt.compile(GrammarSpec.json_schema(schema))
        assert compiled.source == "local"
        here = engine.compile(GrammarSpec.json_schema(schema))
        masks = rt.allocate_bitmask(2)
        engine.new_matcher(compiled.grammar).fill(masks, 0)
        engine.new_matcher(here).fill(masks, 1)
        assert np.array_equal(masks[0], masks[1])


def test_a_job_larger_than_the_inline_limit_is_sent_by_the_sender_thread(deepseek):
    """A spec over 32 KiB could block the writer while the worker reads it: written by the
    pool's sender thread, never by the submitting thread or the reader, and served."""
    schema = {"type": "object", "description": "x" * 50_000,
              "properties": {"a": {"type": "string"}}}
    with GrammarRuntime(deepseek, "xgrammar", compile_timeout_s=60) as rt:
        req = rt.new_request(GrammarSpec.json_schema(schema)).wait(120)
        assert not req.failed, req.error
        assert any(t.name.startswith("pg-compile-send") for t in threading.enumerate())


def test_a_slow_spec_the_worker_answers_from_its_cache_is_still_shipped(deepseek, monkeypatch):
    """A spec that compiled slowly in a worker was shipped, so this process never compiled
    it. Asked again (after it left the memory cache), the worker answers from its engine's
    cache in milliseconds: that timing must not make this process recompile it (the full
    compile time, with no limit, possibly in the pool's reader). The worker's loop runs here
    on a pipe, with a clock that makes the first compile take 1 s and the repeat 1 ms."""
    import types
    from multiprocessing import Pipe

    from portable_guided.runtime import worker as worker_module
    from portable_guided.runtime.engines import engine_class

    ticks = iter([0.0, 1.0, 10.0, 10.001])
    monkeypatch.setattr(worker_module, "time", types.SimpleNamespace(
        perf_counter=lambda: next(ticks)))
    here, there = Pipe()
    payload = engine_class("xgrammar").tokenizer_payload(deepseek)
    loop = threading.Thread(target=worker_module._serve,
                            args=(there, {"xgrammar": payload}, 0.1), daemon=True)
    loop.start()
    try:
        assert here.recv()[0] == "ready"
        spec = GrammarSpec.regex("[a-f]{2}z").to_dict()
        replies = []
        for job_id in (1, 2):
            here.send((job_id, "xgrammar", spec, "auto"))
            replies.append(here.recv())
    finally:
        here.send(None)
        loop.join(60)
    (_, (status1, text1, seconds1)), (_, (status2, text2, seconds2)) = replies
    assert (status1, status2) == ("ok", "ok") and seconds1 == 1.0 and seconds2 < 0.1
    assert isinstance(text1, str)  # slow: serialized
    assert isinstance(text2, str), text2  # fast only thanks to the cache: serialized too


def test_a_fast_compile_with_a_disk_cache_is_serialized_here_outside_the_limit(deepseek,
                                                                              tmp_path):
    """With a disk cache, a fast compile is redone here and serialized here for the disk,
    so its serialization (83 MB took 3.3 s for one schema) does not count against the
    worker's limit."""
    spec = GrammarSpec.regex("[a-f]{3}z")
    with GrammarRuntime(deepseek, "xgrammar", compile_timeout_s=60,
                        disk_cache_dir=str(tmp_path)) as rt:
        compiled = rt.compile(spec, timeout=120)
        assert compiled.source == "local"
    with GrammarRuntime(deepseek, "xgrammar", compile_timeout_s=60,
                        disk_cache_dir=str(tmp_path)) as rt:
        assert rt.compile(spec, timeout=120).source == "disk"  # the entry was written
