"""A burst of new schemas at once, as a serving engine's backend gets them: when is each
grammar ready? Three ways, on the same schemas, in a rotating order per trial:

- ``vllm-like``: xgrammar's own compile (strict mode, as vLLM's xgrammar backend calls
  it) on one thread, first come first served (vLLM's grammar executor on 2 cores);
- ``race``: ``GrammarRuntime(..., compile_race=True)``, what the vLLM and SGLang backends
  use (compiles in this process, smallest first, the time limit kept);
- ``workers``: ``GrammarRuntime`` without racing (every compile in a worker process).

Both runtime modes get the backends' spec: the schema in xgrammar's strict language, its
meta-schema check deferred to the compile. Schemas that either side refuses are left out.

    python bench/bench_compile_burst.py --schemas /tmp/jsb/Github_hard.jsonl \\
        --batch 16 --trials 3 --out bench/results/compile_burst_cpu.json

(Github_hard: JSONSchemaBench, joined into JSONL by bench/bench_engine_choice.py --jsb-dir.)
Reports ready-time p50/p90/max (ms from submission) per mode over all trials.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

from portable_guided.harness.maskbench import machine_note
from portable_guided.json_schema.strict import xgrammar_strict_schema
from portable_guided.runtime import GrammarRuntime, GrammarSpec, load_tokenizer_info
from portable_guided.runtime.engines import create_engine

MODES = ("vllm-like", "race", "workers")


def backend_spec(text: str) -> GrammarSpec:
    """The spec the vLLM backend builds for a ``json`` request (strict, check deferred)."""
    strict = json.dumps(xgrammar_strict_schema(json.loads(text)), ensure_ascii=False)
    spec = GrammarSpec.json_schema(strict, validate=False)
    return GrammarSpec.from_dict({**spec.to_dict(), "deferred_check": True})


def servable(path: Path, n: int, max_chars: int, info: Any) -> list[tuple[str, GrammarSpec]]:
    """The first ``n`` schemas of ``path`` that xgrammar (strict) and our backend's spec
    both take, checked on a throwaway engine (its cache is not the one measured)."""
    probe = create_engine("xgrammar", info)
    out = []
    with path.open() as f:
        for line in f:
            text = json.dumps(json.loads(line)["schema"])
            if len(text) > max_chars:
                continue
            try:
                spec = backend_spec(text)
                probe.prepare(spec)
                probe._compiler.compile_json_schema(text, any_whitespace=True)
            except Exception:  # noqa: BLE001, S112 - refused by one side: not a fair cold request
                continue
            out.append((text, spec))
            if len(out) == n:
                break
    return out


def ready_vllm_like(info: Any, batch: list[tuple[str, GrammarSpec]]) -> list[float]:
    compiler = create_engine("xgrammar", info)._compiler
    pool = ThreadPoolExecutor(1)
    t0 = time.perf_counter()
    futures = [pool.submit(compiler.compile_json_schema, text, any_whitespace=True,
                           strict_mode=True) for text, _ in batch]
    return _ready_ms(futures, t0, lambda: pool.shutdown(wait=True))


def ready_runtime(rt: GrammarRuntime, batch: list[tuple[str, GrammarSpec]]) -> list[float]:
    t0 = time.perf_counter()
    futures = [rt.compile_async(spec) for _, spec in batch]
    return _ready_ms(futures, t0, lambda: [f.exception(600) for f in futures])


def _ready_ms(futures: list[Future[Any]], t0: float, join: Any) -> list[float]:
    ready: list[float] = []
    lock = threading.Lock()

    def done(_: Future[Any]) -> None:
        with lock:
            ready.append((time.perf_counter() - t0) * 1e3)

    for future in futures:
        future.add_done_callback(done)
    join()
    failed = [f.exception() for f in futures if f.exception() is not None]
    if failed:
        print(f"  {len(failed)} failed, e.g. {str(failed[0])[:120]}", file=sys.stderr)
    return ready


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--schemas", required=True, help="JSONL, one {'schema': ...} per line")
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--trials", type=int, default=3)
    ap.add_argument("--max-chars", type=int, default=8000)
    ap.add_argument("--limit", type=float, default=30.0, help="runtime compile limit, s")
    ap.add_argument("--tokenizer", default="deepseek")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()

    info = load_tokenizer_info(args.tokenizer)
    pool = servable(Path(args.schemas), args.batch * args.trials, args.max_chars, info)
    if len(pool) < args.batch * args.trials:
        raise SystemExit(f"only {len(pool)} servable schemas; {args.batch * args.trials} needed")
    runtimes = {"race": GrammarRuntime(info, "xgrammar", compile_timeout_s=args.limit,
                                       compile_race=True),
                "workers": GrammarRuntime(info, "xgrammar", compile_timeout_s=args.limit)}
    for rt in runtimes.values():  # started and warm: the burst measures compiles only
        rt.compile(GrammarSpec.regex("[0-9]+"))
        while not rt.worker_pids():
            time.sleep(0.05)
    ready: dict[str, list[float]] = {m: [] for m in MODES}
    per_trial = []
    for trial in range(args.trials):
        batch = pool[trial * args.batch:(trial + 1) * args.batch]
        order = MODES[trial % len(MODES):] + MODES[:trial % len(MODES)]
        row = {}
        for mode in order:
            got = (ready_vllm_like(info, batch) if mode == "vllm-like"
                   else ready_runtime(runtimes[mode], batch))
            ready[mode] += got
            row[mode] = {"p50_ms": statistics.median(got), "max_ms": max(got)}
            print(f"trial {trial} {mode}: p50 {row[mode]['p50_ms']:.0f} ms, "
                  f"max {row[mode]['max_ms']:.0f} ms", flush=True)
            time.sleep(1.0)  # the cores settle (a runtime's worker may still exit)
        per_trial.append(row)
    summary = {m: {"p50_ms": statistics.median(v), "p90_ms": sorted(v)[int(0.9 * len(v))],
                   "max_ms": max(v), "n": len(v)} for m, v in ready.items()}
    counters = {k: v for k, v in runtimes["race"].metrics().items() if "race" in k}
    for rt in runtimes.values():
        rt.close()
    result = {"meta": {"command": "python " + " ".join(sys.argv), "machine": machine_note(),
                       "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                       "tokenizer": args.tokenizer, "batch": args.batch,
                       "trials": args.trials, "limit_s": args.limit},
              "summary": summary, "per_trial": per_trial, "race_counters": counters}
    print(json.dumps(summary, indent=1))
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
