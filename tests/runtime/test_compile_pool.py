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
