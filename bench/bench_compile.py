"""Benchmark runtime compile latency against the raw engine on a MaskBench sample.

For each schema of a seeded sample of the development split (all files), side by side and in
turn: ``raw`` (the engine's library call alone, timed inside a killable worker process, as
``raw:`` modes of ``portable_guided.harness.maskbench``), ``runtime`` (``GrammarRuntime.compile``
end to end with the time limit, a cache miss: what the first request of a schema waits) and
``runtime-race`` (``GrammarRuntime(compile_race=True)``: the worker's compile raced by the same
compile in this process; after each call the benchmark waits for the worker's side to end, so
the next measurement has both cores). Percentiles are over the schemas every mode compiled. Then the time limit: a pathological schema (xgrammar expands ``maxLength: 32767``)
must fail within 1.5x the limit, its worker killed.

    python bench/bench_compile.py --engine xgrammar --schemas 150 --json /tmp/compile_cpu.json
"""

from __future__ import annotations

import argparse
import datetime
import glob
import json
import os
import random
import sys
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from portable_guided.harness.maskbench import load_records, machine_note
from portable_guided.runtime import (
    GrammarCompileError,
    GrammarRuntime,
    GrammarSpec,
    GrammarTimeout,
    load_tokenizer_info,
)
from portable_guided.runtime.engines import ENGINES, engine_class
from portable_guided.runtime.worker import WorkerPool

DATA = "/work/shared/data/maskbench"
PATHOLOGICAL = {"type": "object", "properties": {
    "name": {"type": "string", "minLength": 1, "maxLength": 255},
    "description": {"type": "string", "maxLength": 32767}}, "additionalProperties": False}


def pct(values: list[float], q: float) -> float:
    return float(np.percentile(values, q)) * 1e3 if values else float("nan")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--engine", default="xgrammar", choices=sorted(ENGINES))
    ap.add_argument("--schemas", type=int, default=200)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--timeout", type=float, default=10.0, help="compile time limit, seconds")
    ap.add_argument("--limit-test", type=float, default=2.0,
                    help="time limit for the pathological schema (0: skip)")
    ap.add_argument("--data", default=DATA)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()

    records = load_records(sorted(glob.glob(os.path.join(args.data, "*.jsonl"))))
    random.Random(args.seed).shuffle(records)
    records = records[: args.schemas]
    info = load_tokenizer_info("deepseek")
    engine = args.engine
    raw = WorkerPool(lambda: {engine: engine_class(engine).tokenizer_payload(info)}, size=1)
    now = GrammarRuntime(info, engine, compile_timeout_s=args.timeout, failure_ttl_s=0)
    race = GrammarRuntime(info, engine, compile_timeout_s=args.timeout, failure_ttl_s=0,
                          compile_race=True)

    def run_raw(spec: GrammarSpec) -> float:
        status, text, seconds = raw.run(engine, spec.to_dict(), args.timeout)
        if status != "ok":
            raise GrammarCompileError(str(text), engine=engine)
        return seconds

    def runtime(rt: GrammarRuntime):
        def run(spec: GrammarSpec) -> float:
            t0 = time.perf_counter()
            rt.compile(spec)
            return time.perf_counter() - t0
        return run

    modes = {"raw": run_raw, "runtime": runtime(now), "runtime-race": runtime(race)}
    warm = GrammarSpec.json_schema({"type": "integer"})
    for fn in modes.values():  # workers start
        fn(warm)
    while not race.worker_pids():  # the race's warm-up was won here, before its worker started
        time.sleep(0.05)
    times: dict[str, list[float]] = {m: [] for m in modes}
    status: dict[str, int] = {}
    per_schema: list[dict] = []
    for i, rec in enumerate(records):
        spec = GrammarSpec.json_schema(rec["schema"])
        order = list(modes)[i % 3:] + list(modes)[: i % 3]  # rotate who goes first
        row: dict[str, float] = {}
        outcome = "ok"
        for mode in order:
            try:
                row[mode] = modes[mode](spec)
            except GrammarTimeout:
                outcome = "timeout"
                break
            except (GrammarCompileError, ValueError):
                outcome = "error"
                break
        status[outcome] = status.get(outcome, 0) + 1
        per_schema.append({"id": rec.get("id"), "status": outcome,
                           **{f"{m}_ms": round(v * 1e3, 3) for m, v in row.items()}})
        if outcome == "ok":
            for mode, s in row.items():
                times[mode].append(s)
        if (i + 1) % 25 == 0:
            print(f"{i + 1} schemas: " + " ".join(
                f"{m} p50={pct(v, 50):.1f}ms" for m, v in times.items()), flush=True)
    summary = {m: {"p50_ms": pct(v, 50), "p90_ms": pct(v, 90), "p99_ms": pct(v, 99)}
               for m, v in times.items()}
    ratios = {m: {"p50": summary[m]["p50_ms"] / summary["raw"]["p50_ms"],
                  "p90": summary[m]["p90_ms"] / summary["raw"]["p90_ms"]}
              for m in modes if m != "raw"}
    paired = {m: float(np.median(np.array(times[m]) / np.array(times["raw"])))
              for m in modes if m != "raw"}
    now_metrics = now.metrics()
    race_metrics = race.metrics()
    for closeable in (raw, now, race):
        closeable.close()

    limit_result = None
    if args.limit_test and engine == "xgrammar":
        limit_result = {}
        for mode, raced in (("runtime", False), ("runtime-race", True)):
            with GrammarRuntime(info, engine, compile_timeout_s=args.limit_test,
                                compile_race=raced) as rt:
                rt.compile(warm)
                while not rt.worker_pids():
                    time.sleep(0.05)
                (pid,) = rt.worker_pids()
                t0 = time.perf_counter()
                try:
                    rt.compile(GrammarSpec.json_schema(PATHOLOGICAL))
                    outcome = "compiled"
                except GrammarTimeout:
                    outcome = "timeout"
                elapsed = time.perf_counter() - t0
                limit_result[mode] = {
                    "limit_s": args.limit_test, "outcome": outcome, "elapsed_s": elapsed,
                    "ratio": elapsed / args.limit_test,
                    "worker_replaced": pid not in rt.worker_pids(),
                    "runaway_left_running": rt._service.runaway is not None}
        print("time limit:", json.dumps(limit_result))

    result = {
        "meta": {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                 "command": "python " + " ".join(sys.argv), "machine": machine_note(),
                 "engine": engine, "tokenizer": "deepseek (129,280)", "schemas": len(records),
                 "seed": args.seed, "timeout_s": args.timeout,
                 "note": "modes run in turn per schema (rotating order); percentiles over the "
                         "schemas all modes compiled; 2 shared cores, noisy"},
        "status": status, "summary": summary, "ratio_to_raw": ratios,
        "median_paired_ratio": paired, "runtime_sources": {
            k: v for k, v in now_metrics.items() if k.startswith("compile")},
        "race_counts": {k: v for k, v in race_metrics.items() if "race" in k},
        "time_limit": limit_result, "per_schema": per_schema,
    }
    print(json.dumps({k: result[k] for k in ("status", "summary", "ratio_to_raw",
                                              "median_paired_ratio")}, indent=1))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
