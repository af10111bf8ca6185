"""The JSON Schema Test Suite (draft 2020-12) per engine: schemas compiled, instances decided
right, invalid instances accepted.

    PYTHONPATH=. python bench/json_schema_suite.py \
        --json bench/results/json_schema_suite.json [--engines xgrammar,llguidance,auto]

SmolLM2 tokenizer; each instance ``json.dumps``-ed, walked token by token, then the stop token
(``portable_guided.harness.schema_suite``).
"""

from __future__ import annotations

import argparse
import datetime
import json
import platform
import sys
import time

from portable_guided.harness.maskbench import machine_note
from portable_guided.harness.schema_suite import load_suite, run_suite, summarize_suite
from portable_guided.runtime import load_tokenizer_info

SUITE = "../shared/data/json-schema-test-suite/draft2020-12"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--suite", default=SUITE)
    p.add_argument("--json", dest="out", default=None)
    p.add_argument("--engines", default="xgrammar,llguidance,auto")
    p.add_argument("--timeout", type=float, default=5.0)
    p.add_argument("--rows", action="store_true", help="print every group's row")
    args = p.parse_args()
    groups = load_suite(args.suite)
    info = load_tokenizer_info("smollm2")
    out: dict = {"command": " ".join(["python", *sys.argv]),
                 "date": datetime.date.today().isoformat(),
                 "machine": {**machine_note(), "platform": platform.platform()},
                 "tokenizer": "smollm2", "timeout_s": args.timeout, "engines": {}}
    for engine in args.engines.split(","):
        t0 = time.perf_counter()
        rows = run_suite(groups, info, engine, timeout_s=args.timeout)
        summary = summarize_suite(rows)
        summary["wall_s"] = round(time.perf_counter() - t0, 1)
        out["engines"][engine] = {"summary": summary, "rows": rows}
        print(engine, json.dumps(summary), flush=True)
        if args.rows:
            for r in rows:
                print(" ", r["id"], r["status"], r["tests"], r.get("error", "")[:150])
    if args.out:
        with open(args.out, "w", encoding="utf-8") as fh:
            json.dump(out, fh, separators=(",", ":"))  # compact: one row per group
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
