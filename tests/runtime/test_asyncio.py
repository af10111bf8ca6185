"""The asyncio API keeps the event loop responsive while large batches fill."""

from __future__ import annotations

import asyncio
import time

from portable_guided.runtime import GrammarRuntime, GrammarSpec

SPEC = GrammarSpec.json_schema(
    {"type": "object", "properties": {"text": {"type": "string"}, "n": {"type": "number"}}})


def test_loop_lag_while_filling(deepseek):
    # One fill thread: the offloaded fill then occupies one core and leaves the loop the
    # other (on a 2-core runner, two fill threads would compete with the loop for CPU and
    # measure the OS scheduler, not the GIL).
    with GrammarRuntime(deepseek, "xgrammar", compile_timeout_s=None, fill_threads=1) as rt:
        _check_loop_lag(rt)


def _check_loop_lag(rt: GrammarRuntime) -> None:
    reqs = [rt.new_request(SPEC).wait(60) for _ in range(128)]
    for r in reqs:  # inside a string almost every token is allowed: a costly mask
        r.accept_tokens(rt.info.encode('{"text": "hello wor'))
    bm = rt.allocate_bitmask(128)

    async def ticker(stop: asyncio.Event, lags: list[float]) -> None:
        while not stop.is_set():
            t = time.perf_counter()
            await asyncio.sleep(0.0005)
            lags.append(time.perf_counter() - t - 0.0005)

    async def run(offload: bool) -> tuple[float, float]:  # (p90 loop lag, fastest fill)
        stop, lags, fills = asyncio.Event(), [], []
        task = asyncio.create_task(ticker(stop, lags))
        await asyncio.sleep(0.01)
        for _ in range(15):
            t = time.perf_counter()
            if offload:
                await rt.afill_bitmask(reqs, bm)
            else:
                rt.fill_bitmask(reqs, bm)  # what a CPU-bound call in the loop does
                await asyncio.sleep(0)
            fills.append(time.perf_counter() - t)
        stop.set()
        await task
        lags.sort()
        return lags[len(lags) * 9 // 10], min(fills)

    blocking_lag, fill_time = asyncio.run(run(offload=False))
    offloaded_lag, _ = asyncio.run(run(offload=True))
    # p90 loop lag: blocking the loop delays ticks by up to a whole fill; with the fill
    # offloaded (the engines release the GIL) ticks stay close to on time.
    assert blocking_lag >= 0.5 * fill_time, (blocking_lag, fill_time)
    assert offloaded_lag < 0.5 * blocking_lag, (offloaded_lag, fill_time, blocking_lag)


def test_async_compile_accept_and_ready(runtimes):
    rt = runtimes["llguidance"]

    async def main() -> tuple[bool, int]:
        compiled = await rt.acompile(GrammarSpec.regex("[0-9]{2}"))
        req = rt.new_request(GrammarSpec.regex("[0-9]{2}"))
        await req.await_ready()
        ok = True
        for t in rt.info.encode("42"):
            ok &= await req.aaccept(t)
        ok &= await req.aaccept(rt.info.stop_token_ids[0])
        return ok and req.is_terminated, compiled.nbytes

    ok, nbytes = asyncio.run(main())
    assert ok and nbytes > 0


def test_awaiting_a_slow_compile_holds_no_executor_thread(deepseek):
    """``await_ready`` used to wait in the runtime's 4-thread executor: four requests
    awaiting a slow compile held every thread, and ``afill_bitmask`` / ``aaccept`` of a
    ready request waited for that compile (seconds), even after the waits were cancelled."""
    from test_compile_service import nested_any_of

    with GrammarRuntime(deepseek, "xgrammar", compile_timeout_s=30) as rt:
        ready = rt.new_request(GrammarSpec.regex("[0-9]+")).wait(120)
        slow = [rt.new_request(GrammarSpec.json_schema(nested_any_of(7))) for _ in range(6)]

        async def main() -> bool:
            waits = [asyncio.ensure_future(r.await_ready()) for r in slow]
            await asyncio.sleep(0.1)  # every wait has started
            bitmask = rt.allocate_bitmask(1)
            await rt.afill_bitmask([ready], bitmask)
            await ready.aaccept(rt.info.encode("7")[0])
            still_compiling = not slow[0].ready
            for wait in waits:
                wait.cancel()
            await asyncio.gather(*waits, return_exceptions=True)
            return still_compiling

        assert asyncio.run(main()), "the fill waited for the slow compile"
