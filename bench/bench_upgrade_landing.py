"""How soon an engine upgrade lands: from the moment ``auto``'s first compile of a new JSON
schema returns (llguidance's grammar) until later requests get xgrammar's, for the first
``--limit`` schemas of each MaskBench file, one schema at a time, each mode on a runtime of
its own, modes alternating schema by schema:

- ``here``: the worker only checks the spec (``prepare``) and this process compiles it once
  (``compile_service.UPGRADE_COMPILES_HERE = True``, the default);
- ``worker``: the worker compiles it, then this process compiles it again (before).

    python bench/bench_upgrade_landing.py --limit 5 --out bench/results/upgrade_landing_cpu.json

Per mode: landing ms p50/p90/p99 over the upgrades that landed, how many landed, failed
(refused, or past ``UPGRADE_LIMIT_S``) or were still running at ``--wait`` seconds.
"""

from __future__ import annotations

import argparse
import glob
import time
from typing import Any

import numpy as np

from portable_guided.harness.maskbench import load_records, write_results
from portable_guided.runtime import (
    GrammarRuntime,
    GrammarSpec,
    compile_service,
    load_tokenizer_info,
)
from portable_guided.runtime.errors import GrammarCompileError, GrammarSpecError

MODES = {"here": True, "worker": False}


def land(rt: GrammarRuntime, spec: GrammarSpec, wait_s: float) -> tuple[str, float | None]:
    """Compile ``spec`` and wait for its upgrade: (final state, ms from the compile's return
    to that state; None if none started)."""
    rt.compile(spec)
    t0 = time.perf_counter()
    if rt.upgrade_state(spec) is None:
        return "none", None
    deadline = time.monotonic() + wait_s
    while rt.upgrade_state(spec) == "running" and time.monotonic() < deadline:
        time.sleep(0.001)
    return str(rt.upgrade_state(spec)), (time.perf_counter() - t0) * 1e3


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--files", nargs="*", default=sorted(glob.glob("../shared/data/maskbench/*.jsonl")))
    ap.add_argument("--limit", type=int, default=5)
    ap.add_argument("--tokenizer", default="deepseek")
    ap.add_argument("--wait", type=float, default=30.0)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    info = load_tokenizer_info(args.tokenizer)
    runtimes = {m: GrammarRuntime(info, "auto", compile_timeout_s=10, failure_ttl_s=0)
                for m in MODES}
    rows: list[dict[str, Any]] = []
    try:
        for rt in runtimes.values():
            rt.compile(GrammarSpec.json_schema({"type": "integer"}))  # workers started
        for rec in load_records(args.files, limit=args.limit):
            row: dict[str, Any] = {"id": rec["id"]}
            for mode in (list(MODES) if len(rows) % 2 == 0 else list(MODES)[::-1]):
                compile_service.UPGRADE_COMPILES_HERE = MODES[mode]
                try:
                    spec = GrammarSpec.json_schema(rec["schema"])
                    row[mode] = land(runtimes[mode], spec, args.wait)
                except (GrammarCompileError, GrammarSpecError):
                    row[mode] = ("compile_error", None)
            rows.append(row)
            print(row, flush=True)
    finally:
        compile_service.UPGRADE_COMPILES_HERE = True
        for rt in runtimes.values():
            rt.close()
    summary = {}
    for mode in MODES:
        states = [r[mode][0] for r in rows]
        landed = [r[mode][1] for r in rows if r[mode][0] == "done"]
        summary[mode] = {
            "landed": len(landed), "failed": states.count("failed"),
            "still_running": states.count("running"), "schemas": len(rows),
            **{f"landing_ms_p{q}": round(float(np.percentile(landed, q)), 1)
               for q in (50, 90, 99) if landed}}
    both = [(r["worker"][1], r["here"][1]) for r in rows
            if r["worker"][0] == "done" and r["here"][0] == "done"]
    if both:
        summary["ratio_here_over_worker_p50"] = round(float(np.median(
            [h / w for w, h in both])), 3)
    write_results(args.out, {"files": args.files, "limit_per_file": args.limit,
                             "tokenizer": args.tokenizer,
                             "upgrade_limit_s": compile_service.UPGRADE_LIMIT_S,
                             "summary": summary, "per_schema": rows})
    print(summary)


if __name__ == "__main__":
    main()
