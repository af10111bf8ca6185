"""Compile latency a serving engine can promise: deadlines from submission, the compile
after a kill, and an adversarial burst, per engine (portable_guided/harness/latency.py).

    python bench/bench_latency.py --out bench/results/latency_cpu.json

The same script measures an older checkout of the runtime (copy harness/latency.py into it
and put it first on ``PYTHONPATH``) for a before/after table; the JSON records which.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

import portable_guided
from portable_guided.harness import latency
from portable_guided.runtime import load_tokenizer_info

MASKBENCH = Path(__file__).resolve().parents[2] / "shared/data/maskbench/Github_easy.jsonl"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--engines", default="xgrammar,llguidance,auto")
    ap.add_argument("--limit", type=float, default=2.0, help="compile time limit, seconds")
    ap.add_argument("--repeats", type=int, default=3, help="pathological compiles per engine")
    ap.add_argument("--benign", type=int, default=32, help="benign schemas in the burst")
    ap.add_argument("--pathological", type=int, default=8, help="pathological specs in it")
    ap.add_argument("--maskbench", default=str(MASKBENCH))
    ap.add_argument("--label", default="current")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()

    info = load_tokenizer_info("deepseek", vocab_size=129_344)
    schemas = latency.benign_schemas(args.maskbench, args.benign)
    out: dict = {
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "label": args.label,
        "runtime_from": str(Path(portable_guided.__file__).parent),
        "commit": _commit(Path(portable_guided.__file__).parent),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "machine": {"uname": " ".join(platform.uname()), "cpus": os.cpu_count()},
        "limit_s": args.limit, "benign_source": args.maskbench, "engines": {},
    }
    for engine in args.engines.split(","):
        rt = latency.warm_runtime(info, engine, args.limit)
        try:
            deadline = latency.measure_deadline(rt, repeats=args.repeats)
        finally:
            rt.close()
        solo_rt = latency.warm_runtime(info, engine, args.limit)
        try:
            solo = latency.solo_seconds(solo_rt, schemas, "solo")
        finally:
            solo_rt.close()
        rt = latency.warm_runtime(info, engine, args.limit)
        time.sleep(1.0)  # the warm-up's spare and replacement workers are up
        try:
            burst = latency.measure_burst(rt, schemas, solo, pathological=args.pathological)
        finally:
            rt.close()
        row = {
            "deadline": {"resolved_s": deadline.resolved_s, "outcomes": deadline.errors,
                         "next_compile_s": deadline.next_compile_s,
                         "within_target": max(deadline.resolved_s) <= 1.25 * args.limit + 0.2},
            "burst": burst.as_dict(),
            "burst_summary": {
                "benign_solo": latency.percentiles(solo),
                "benign_in_burst": latency.percentiles(burst.benign_s),
                "benign_over_target": len(burst.benign_over_target()),
                "benign_failed": burst.benign_failed,
                "pathological": latency.percentiles(burst.pathological_s),
                "pathological_over_deadline": len(burst.pathological_over_deadline()),
            },
        }
        out["engines"][engine] = row
        print(engine, json.dumps({"deadline": row["deadline"],
                                  "burst": row["burst_summary"]}, indent=1), flush=True)
    Path(args.out).write_text(json.dumps(out, indent=1) + "\n")


def _commit(where: Path) -> str:
    try:
        return subprocess.run(["git", "-C", str(where), "rev-parse", "--short", "HEAD"],
                              capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


if __name__ == "__main__":
    main()
