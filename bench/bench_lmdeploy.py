"""lmdeploy 0.18.0's PyTorch-engine grammar path alone vs with portable_guided, on this CPU.

**Event-loop stalls** (``--stalls``): lmdeploy's model agent builds a ``FusedLogitsProcessor``
each step on its asyncio loop; its constructor compiles the grammar of every new request
(``GuidedDecodingManager.get_processors``) synchronously. Here a loop runs that step as
the agent does (new processor, masked scores, greedy sampling, accept) on random logits
of SmolLM2's width while a heartbeat coroutine (``asyncio.sleep(1 ms)`` in a loop) measures how
late the loop wakes it. One new request arrives per step with the next MaskBench
Github_medium schema and lives ``--live`` steps. ``lmdeploy``: lmdeploy's own manager (the
plugin off); ``ours``: the runtime backend (``PORTABLE_GUIDED_LMDEPLOY_BACKEND=1``,
compile limit ``--limit`` s, one compile worker). The real SmolLM2 tokenizer; the forward
pass is left out (random logits). CUDA-only stub: ``FusedLogitsProcessor._wait_stream_once``.

**Apply per step** (``--apply``): ``GuidedDecodingManager.apply_batched_bitmap``, lmdeploy's
own (xgrammar's CPU kernel) vs ours (``apply_token_mask``), B in 1-64, fp32 and bf16, masks
99% blocked; interleaved rep by rep, each call on a fresh copy (not timed), medians, every
result checked equal to lmdeploy's.

**Speculative verification** (``--spec``): ``GuidedSpecHelper.apply_serial_bitmask`` per
step, B requests (the first Github_medium schemas with a valid instance of at least 60
tokens), 3 drafts a step taken from each instance (all accepted, then the bonus token), on
``[B, 4, V]`` fp32 scores: lmdeploy's own (forked xgrammar matchers, a thread hop per
position for the fill and another for the accept), ours through that same per-position path
(our forks: each mask from ``fill_draft_masks`` on the original request), ours through one
``Request.fill_draft_masks`` per request for all positions (the backend's). Same steps, modes interleaved step by step;
our engine pinned to xgrammar; the two paths of ours checked equal at every step.
Needs the lmdeploy-cpu lane's venv:

    .venv-lmdeploy-cpu/bin/python bench/bench_lmdeploy.py --stalls --apply --spec \
        --json bench/results/lmdeploy_cpu.json
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import json
import os
import platform
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

VOCAB = 49152


def _schemas_path() -> Path:
    path = REPO.parent / "shared" / "data" / "maskbench" / "Github_medium.jsonl"
    return path if path.exists() else Path("/work/shared/data/maskbench/Github_medium.jsonl")


def _schemas(limit: int) -> list[dict[str, Any]]:
    from portable_guided.harness.generation import maskbench_items

    return maskbench_items([str(_schemas_path())], limit)


async def _no_wait(self: Any) -> None:
    return None


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def _stalls(mode: str, schemas: list[dict[str, Any]], live: int, limit: float) -> dict[str, Any]:
    import torch
    from lmdeploy.pytorch.engine.guided_process import GuidedDecodingManager
    from lmdeploy.pytorch.engine.logits_process import FusedLogitsProcessor, SamplingInputs

    from portable_guided.integrations import lmdeploy as plugin
    from tests.lmdeploy_plugin.support import tokenizer

    FusedLogitsProcessor._wait_stream_once = _no_wait  # type: ignore[method-assign]
    plugin.unpatch()
    os.environ["PORTABLE_GUIDED_LMDEPLOY_BACKEND"] = "1" if mode == "ours" else "0"
    os.environ["PORTABLE_GUIDED_LMDEPLOY_COMPILE_TIMEOUT_S"] = str(limit)
    os.environ["PORTABLE_GUIDED_LMDEPLOY_COMPILE_WORKERS"] = "1"
    if mode == "ours":
        plugin.register()
    manager = GuidedDecodingManager(tokenizer(), VOCAB)
    gen = torch.Generator().manual_seed(0)
    lateness: list[float] = []
    build_s: list[float] = []
    failed: list[str] = []
    step_s: list[float] = []
    remove_s: list[float] = []
    sample_s: list[float] = []

    async def heartbeat(stop: asyncio.Event) -> None:
        while not stop.is_set():
            t0 = time.perf_counter()
            await asyncio.sleep(0.001)
            lateness.append(time.perf_counter() - t0 - 0.001)

    async def engine() -> None:
        active: list[tuple[int, dict[str, Any], int]] = []  # (session, format, steps left)
        for i, record in enumerate([*schemas, *([None] * live)]):
            if record is not None:
                fmt = {"type": "json_schema",
                       "json_schema": {"name": record["id"], "schema": record["schema"]}}
                active.append((i, fmt, live))
            if not active:
                continue
            inputs = SamplingInputs(
                max_top_k=1, max_num_logprobs=-1, batch_size=len(active),
                logits_processors=[[] for _ in active],
                response_formats=tuple(f for _, f, _ in active),
                session_ctx=[{"session_id": s, "seq_id": 0} for s, _, _ in active])
            t0 = time.perf_counter()
            try:
                processor = FusedLogitsProcessor(inputs, guided_decoding_manager=manager)
            except Exception as exc:  # noqa: BLE001 - lmdeploy's compile error: recorded
                failed.append(f"{record and record['id']}: {type(exc).__name__}")
                build_s.append(time.perf_counter() - t0)
                active.pop()
                await asyncio.sleep(0)
                continue
            build_s.append(time.perf_counter() - t0)
            logits = torch.randn(len(active), VOCAB, generator=gen)
            scores, _ = await processor(logits)
            t1 = time.perf_counter()
            tokens = processor.sampling(scores)
            sample_s.append(time.perf_counter() - t1)
            await processor.accept_guided_tokens(tokens)
            step_s.append(time.perf_counter() - t0)
            kept = []
            for session, fmt, left in active:
                if left > 1:
                    kept.append((session, fmt, left - 1))
                else:
                    t1 = time.perf_counter()
                    manager.remove_processor(session)
                    remove_s.append(time.perf_counter() - t1)
            active = kept
            await asyncio.sleep(0)

    async def main() -> float:
        stop = asyncio.Event()
        beat = asyncio.create_task(heartbeat(stop))
        await asyncio.sleep(0.01)  # the heartbeat runs before the first step
        t0 = time.perf_counter()
        await engine()
        wall = time.perf_counter() - t0
        stop.set()
        await beat
        return wall

    wall = asyncio.run(main())
    if mode == "ours":
        metrics = manager._pg_runtime.metrics()
        manager._pg_runtime.close()
    else:
        metrics = {}
    plugin.unpatch()
    os.environ["PORTABLE_GUIDED_LMDEPLOY_BACKEND"] = "0"
    plugin.register()
    ms = [x * 1e3 for x in lateness]
    return {
        "schemas": len(schemas), "wall_s": round(wall, 2),
        "loop_stall_ms": {"max": round(max(ms), 1), "p99": round(_percentile(ms, 0.99), 1),
                          "p90": round(_percentile(ms, 0.9), 1),
                          "p50": round(statistics.median(ms), 2), "beats": len(ms)},
        "processor_build_on_loop_ms": {
            "max": round(max(build_s) * 1e3, 1),
            "p90": round(_percentile(build_s, 0.9) * 1e3, 1),
            "p50": round(statistics.median(build_s) * 1e3, 2),
            "worst_schema": schemas[min(build_s.index(max(build_s)), len(schemas) - 1)]["id"]},
        "step_ms_p50": round(statistics.median(step_s) * 1e3, 1),
        "on_loop_max_ms": {"sampling": round(max(sample_s) * 1e3, 1),
                           "remove_processor": round(max(remove_s, default=0) * 1e3, 1)},
        "lmdeploy_errors": failed,
        "runtime": {k: metrics.get(k) for k in ("requests", "requests_failed", "compiles",
                                                 "compile_timeouts") if k in metrics},
    }


def _spec(batch: int, steps: int) -> dict[str, Any]:
    import torch
    from lmdeploy.pytorch.engine.guided_process import GuidedDecodingManager
    from lmdeploy.pytorch.spec_decode.guided_spec_helper import GuidedSpecHelper

    from portable_guided.harness.maskbench import load_records
    from portable_guided.integrations import lmdeploy as plugin
    from tests.lmdeploy_plugin.support import tokenizer

    tok = tokenizer()
    plugin.unpatch()
    os.environ["PORTABLE_GUIDED_LMDEPLOY_BACKEND"] = "1"
    os.environ["PORTABLE_GUIDED_LMDEPLOY_ENGINE"] = "xgrammar"  # lmdeploy's masks exactly
    plugin.register()
    ours = GuidedDecodingManager(tok, VOCAB)
    rows = []
    # Instances the language takes whole (lmdeploy's xgrammar strict mode: declared
    # properties only, in the schema's order), so every draft is accepted.
    for rec in load_records([str(_schemas_path())]):
        fmt = {"type": "json_schema", "json_schema": {"name": rec["id"], "schema": rec["schema"]}}
        for test in rec.get("tests", []):
            ids = tok.encode(json.dumps(test["data"]), add_special_tokens=False)
            if not test["valid"] or len(ids) < 60:
                continue
            probe = ours.get_processor(-1, 0, fmt)
            for t in ids:
                ours.accept_token(probe, t)
            ok = (probe.request is not None and not probe.request.failed
                  and probe.request.num_rejected == 0)
            ours.remove_processor(-1)
            if ok:
                rows.append((rec, ids))
                break
        if len(rows) == batch:
            break
    formats = [{"type": "json_schema", "json_schema": {"name": r["id"], "schema": r["schema"]}}
               for r, _ in rows]

    def ctx(first: int) -> list[dict[str, int]]:
        return [{"session_id": first + i, "seq_id": 0} for i in range(len(rows))]

    # lmdeploy's own manager and matchers are made while the plugin is off.
    plugin.unpatch()
    os.environ["PORTABLE_GUIDED_LMDEPLOY_BACKEND"] = "0"
    own = GuidedDecodingManager(tok, VOCAB)
    procs = {"lmdeploy": own.get_processors(ctx(900), formats)}
    os.environ["PORTABLE_GUIDED_LMDEPLOY_BACKEND"] = "1"
    plugin.register()
    procs["ours_fork"] = ours.get_processors(ctx(1000), formats)
    procs["ours_fill_draft_masks"] = ours.get_processors(ctx(1100), formats)
    for p in [*procs["ours_fork"].values(), *procs["ours_fill_draft_masks"].values()]:
        p.wait()
    serial = GuidedSpecHelper.__dict__["apply_serial_bitmask"]
    fork_path = serial.__wrapped__  # lmdeploy's own function, forking our processors
    modes = {"lmdeploy": (own, fork_path), "ours_fork": (ours, fork_path),
             "ours_fill_draft_masks": (ours, serial)}
    times: dict[str, list[float]] = {name: [] for name in modes}
    n = min(steps, min(len(ids) for _, ids in rows) // 4)
    gen = torch.Generator().manual_seed(0)
    differ_from_lmdeploy = 0
    for step in range(n):
        drafts = torch.tensor([ids[4 * step:4 * step + 3] for _, ids in rows])
        bonus = torch.tensor([ids[4 * step + 3] for _, ids in rows])
        scores = torch.randn(len(rows), 4, VOCAB, generator=gen)
        results = {}
        for name, (mgr, fn) in modes.items():
            helper = GuidedSpecHelper(mgr)
            mine = scores.clone()
            t0 = time.perf_counter()
            asyncio.run(fn(helper, mine, procs[name], drafts, 3))
            times[name].append(time.perf_counter() - t0)
            results[name] = mine
            asyncio.run(helper.accept_rejection_sampled_tokens(
                procs[name], torch.zeros(len(rows), dtype=torch.long), drafts, bonus, 3))
        # The same engine and grammar: the two paths' masks must be equal. (lmdeploy's
        # compile reads some schemas differently from our lowering: counted, not checked.)
        if not torch.equal(results["ours_fork"], results["ours_fill_draft_masks"]):
            raise AssertionError(f"step {step}: fill_draft_masks differs from the fork path")
        differ_from_lmdeploy += not torch.equal(results["lmdeploy"], results["ours_fork"])
    engine = ours._pg_runtime.engine
    ours._pg_runtime.close()
    plugin.unpatch()
    os.environ["PORTABLE_GUIDED_LMDEPLOY_BACKEND"] = "0"
    plugin.register()
    return {"batch": len(rows), "steps": n, "drafts_per_step": 3, "our_engine": engine,
            "schemas": [r["id"] for r, _ in rows],
            "steps_where_lmdeploy_masks_differ": differ_from_lmdeploy,
            "step_ms_p50": {k: round(statistics.median(v) * 1e3, 2) for k, v in times.items()},
            "step_ms_last_quarter_p50": {
                k: round(statistics.median(v[-max(1, n // 4):]) * 1e3, 2)
                for k, v in times.items()}}


def _masks(rows: int, vocab: int, blocked: float, seed: int) -> Any:
    import torch

    words = (vocab + 31) // 32
    g = torch.Generator().manual_seed(seed)
    bits = (torch.rand(rows, words * 32, generator=g) >= blocked).view(rows, words, 32)
    values = (bits.to(torch.int64) << torch.arange(32, dtype=torch.int64)).sum(-1)
    return ((values + 2**31) % 2**32 - 2**31).to(torch.int32)


def _apply(batches: list[int], vocab: int, reps: int) -> list[dict[str, Any]]:
    import torch
    from lmdeploy.pytorch.engine.guided_process import GuidedDecodingManager

    from portable_guided.integrations import lmdeploy as plugin

    plugin.register()
    assert plugin.is_patched()
    manager = object.__new__(GuidedDecodingManager)
    theirs = GuidedDecodingManager.__dict__["apply_batched_bitmap"].__wrapped__
    ours = GuidedDecodingManager.apply_batched_bitmap
    cells = []
    for dtype in (torch.float32, torch.bfloat16):
        for batch in batches:
            base = (torch.randn(batch, vocab) * 4).to(dtype)
            mask = _masks(batch, vocab, 0.99, seed=batch)
            ours(manager, base.clone(), mask)  # the canary's first call
            times: dict[str, list[float]] = {"lmdeploy": [], "ours": []}
            for _ in range(reps):
                order = ["lmdeploy", "ours"]
                random.shuffle(order)
                out = {}
                for name in order:
                    logits = base.clone()
                    torch.mm(base[:1].float(), base[:1].float().T)  # a torch op first (OpenMP)
                    t0 = time.perf_counter()
                    (theirs if name == "lmdeploy" else ours)(manager, logits, mask)
                    times[name].append(time.perf_counter() - t0)
                    out[name] = logits
                if not torch.equal(out["ours"], out["lmdeploy"]):
                    raise AssertionError(f"ours differs from lmdeploy's at B={batch} {dtype}")
            med = {k: statistics.median(v) * 1e3 for k, v in times.items()}
            cells.append({"dtype": str(dtype).split(".")[1], "batch": batch, "vocab": vocab,
                          "lmdeploy_ms": round(med["lmdeploy"], 3),
                          "ours_ms": round(med["ours"], 3),
                          "speedup": round(med["lmdeploy"] / med["ours"], 2)})
            print(cells[-1], flush=True)
    return cells


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--stalls", action="store_true", help="event-loop stalls")
    parser.add_argument("--apply", action="store_true", help="apply per step")
    parser.add_argument("--schemas", type=int, default=40,
                        help="Github_medium schemas for lmdeploy alone (first N)")
    parser.add_argument("--ours-schemas", type=int, default=200,
                        help="Github_medium schemas for our backend (first N)")
    parser.add_argument("--live", type=int, default=4, help="steps each request lives")
    parser.add_argument("--limit", type=float, default=10.0, help="our compile limit (s)")
    parser.add_argument("--reps", type=int, default=30)
    parser.add_argument("--batches", default="1,4,16,64")
    parser.add_argument("--spec", action="store_true", help="speculative verification")
    parser.add_argument("--spec-batch", type=int, default=8)
    parser.add_argument("--spec-steps", type=int, default=60)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    import lmdeploy
    import torch

    result: dict[str, Any] = {
        "benchmark": "bench/bench_lmdeploy.py",
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "machine": {"platform": platform.platform(), "processor": platform.processor(),
                    "cpus": os.cpu_count(), "torch_threads": torch.get_num_threads(),
                    "device": "cpu"},
        "versions": {"lmdeploy": lmdeploy.__version__, "torch": torch.__version__},
        "load_average_1min_before": round(os.getloadavg()[0], 2),
    }
    if args.stalls:
        result["stalls"] = {
            "lmdeploy": _stalls("lmdeploy", _schemas(args.schemas), args.live, args.limit),
            "ours_same_schemas": _stalls("ours", _schemas(args.schemas), args.live,
                                         args.limit),
        }
        print(json.dumps(result["stalls"], indent=1), flush=True)
        if args.ours_schemas > args.schemas:
            result["stalls"]["ours"] = _stalls("ours", _schemas(args.ours_schemas), args.live,
                                               args.limit)
            print(json.dumps(result["stalls"]["ours"], indent=1), flush=True)
        result["stalls"]["limit_s"] = args.limit
        result["stalls"]["live_steps"] = args.live
    if args.apply:
        result["apply"] = _apply([int(b) for b in args.batches.split(",")], VOCAB, args.reps)
    if args.spec:
        result["spec"] = _spec(args.spec_batch, args.spec_steps)
        print(json.dumps(result["spec"], indent=1), flush=True)
    result["load_average_1min_after"] = round(os.getloadavg()[0], 2)
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
