"""What ``Request.fill`` adds to xgrammar's own fill, paced as a server's decode step is.

For the valid instances of the first ``--limit`` schemas of each file (compiled by the
``xgrammar`` engine), four ways to fill the same grammar state, walked in lockstep, in a
new random order at every token, each after a sleep of ``--pace-ms``:

- ``raw``: ``xgrammar.GrammarMatcher.fill_next_token_bitmask`` on raw xgrammar's grammar of
  the schema (as vLLM compiles it);
- ``matcher``: the same call on our grammar (the engine's grammar, no runtime around it);
- ``matcher+count``: that, then ``np.count_nonzero`` of the row (a dead-end test);
- ``request``: ``Request.fill`` (row checks, lock, hand-over check, dead-end test).

    python bench/bench_fill_overhead.py --limit 10 --out bench/results/fill_overhead_cpu.json

Per way: mask us p50/p90/p99 over every token. ``raw`` against ``matcher`` says what our
grammar costs; ``request`` against ``matcher`` what the runtime adds. A mask after an idle
wait costs several times one right after another on this VM, so back-to-back timings
(``--pace-ms 0``) say little about a server.
"""

from __future__ import annotations

import argparse
import glob
import json
import random
import time
from typing import Any

import numpy as np

from portable_guided.harness.maskbench import load_records, machine_note, write_results
from portable_guided.runtime import GrammarRuntime, GrammarSpec, load_tokenizer_info

WAYS = ("raw", "matcher", "matcher+count", "request")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--files", nargs="*",
                    default=sorted(glob.glob("../shared/data/maskbench/*.jsonl")))
    ap.add_argument("--limit", type=int, default=15, help="schemas per file")
    ap.add_argument("--skip", type=int, default=0, help="schemas skipped per file first")
    ap.add_argument("--pace-ms", type=float, default=10.0)
    ap.add_argument("--tokenizer", default="deepseek")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out")
    args = ap.parse_args()

    import xgrammar as xgr

    from portable_guided.runtime.engines import xgrammar as xgr_engine

    info = load_tokenizer_info(args.tokenizer)
    raw_compiler = xgr.GrammarCompiler(xgr_engine.tokenizer(info), max_threads=1)
    rng = random.Random(args.seed)
    pace = args.pace_ms / 1e3
    times: dict[str, list[float]] = {w: [] for w in WAYS}
    schemas = 0
    bm = np.zeros((1, info.bitmask_words), dtype=np.int32)
    with GrammarRuntime(info, "xgrammar", compile_timeout_s=10, fill_threads=1,
                        failure_ttl_s=0) as rt:
        for path in args.files:
            for rec in load_records([path], limit=args.skip + args.limit)[args.skip:]:
                valid = [t for t in rec.get("tests", []) if t.get("valid")]
                try:
                    spec = GrammarSpec.json_schema(rec["schema"])
                    ours = rt.compile(spec)
                    raw = raw_compiler.compile_json_schema(
                        json.dumps(rec["schema"]), any_whitespace=True, strict_mode=False)
                except Exception as exc:  # noqa: BLE001 - refused or failed: not measured
                    print(f"{rec['id']}: skipped ({type(exc).__name__})")
                    continue
                if not valid:
                    continue
                schemas += 1
                ids = info.encode(json.dumps(valid[0]["data"], ensure_ascii=False))
                _walk(ids, _ways(xgr, raw, ours, rt, spec, bm), times, rng, pace)
    summary = {w: _percentiles(v) for w, v in times.items()}
    for w in WAYS:
        print(f"{w:14s} p50/p90/p99 us {summary[w]['p50']:7.1f} {summary[w]['p90']:7.1f} "
              f"{summary[w]['p99']:7.1f}  ({summary[w]['masks']} masks)")
    if args.out:
        write_results(args.out, {"command": "python bench/bench_fill_overhead.py " + " ".join(
            f"--{k.replace('_', '-')} {v}" for k, v in vars(args).items()
            if k not in ("files", "out")), "files": args.files, "schemas": schemas,
            "machine": machine_note(), "summary": summary})


def _ways(xgr: Any, raw: Any, ours: Any, rt: GrammarRuntime, spec: GrammarSpec,
          bm: np.ndarray) -> dict[str, tuple[Any, Any]]:
    """(fill, accept) of each way, each on a matcher (or request) of its own."""
    raw_m = xgr.GrammarMatcher(raw)
    ours_m = xgr.GrammarMatcher(ours.grammar)
    counted = xgr.GrammarMatcher(ours.grammar)
    req = rt.new_request(spec, on_error="reject")

    def count_fill() -> None:
        counted.fill_next_token_bitmask(bm, 0)
        np.count_nonzero(bm[0])

    return {
        "raw": (lambda: raw_m.fill_next_token_bitmask(bm, 0), raw_m.accept_token),
        "matcher": (lambda: ours_m.fill_next_token_bitmask(bm, 0), ours_m.accept_token),
        "matcher+count": (count_fill, counted.accept_token),
        "request": (lambda: req.fill(bm, 0), req.accept),
    }


def _walk(ids: list[int], ways: dict[str, tuple[Any, Any]], times: dict[str, list[float]],
          rng: random.Random, pace: float) -> None:
    perf = time.perf_counter
    order = list(ways)
    for token in ids:
        rng.shuffle(order)
        for way in order:
            time.sleep(pace)
            fill = ways[way][0]
            t0 = perf()
            fill()
            times[way].append(perf() - t0)
        if not all(accept(token) for _, accept in ways.values()):
            return  # (a way rejected the instance: property order, say; the walk ends)


def _percentiles(values: list[float]) -> dict[str, float]:
    us = np.asarray(values) * 1e6
    return {"masks": int(us.size), **{f"p{q}": round(float(np.percentile(us, q)), 1)
                                      for q in (50, 90, 99)}}


if __name__ == "__main__":
    main()
