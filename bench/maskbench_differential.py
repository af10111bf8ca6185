"""Cross-engine differential on MaskBench (xgrammar vs llguidance, same instances).

    python bench/maskbench_differential.py ../shared/data/maskbench/*.jsonl \
        --json bench/results/differential_dev_full.json [--limit N] [--timeout 10] [--strict]

Writes per-schema rows and a summary: schemas both engines compile, and those whose
instances get different accept/reject decisions (with the label saying who is right).
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from collections import Counter

from portable_guided.harness.differential import compare_engines, disagreements
from portable_guided.harness.maskbench import load_records
from portable_guided.runtime import load_tokenizer_info


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("files", nargs="+")
    p.add_argument("--json", required=True, dest="out")
    p.add_argument("--limit", type=int, default=None)
    p.add_argument("--timeout", type=float, default=10.0)
    p.add_argument("--strict", action="store_true", help="the strict variant (strict=True)")
    args = p.parse_args()
    records = load_records(args.files, args.limit)
    info = load_tokenizer_info("deepseek")
    t0 = time.perf_counter()
    done = [0]

    partial: list[dict] = []

    def progress(row: dict) -> None:
        done[0] += 1
        partial.append(row)
        if done[0] % 100 == 0:  # a long run cut short keeps what it finished
            print(f"{done[0]}/{len(records)} {time.perf_counter() - t0:.0f} s", file=sys.stderr,
                  flush=True)
            write(args.out, partial, args, time.perf_counter() - t0)

    rows = compare_engines(records, info, timeout_s=args.timeout, strict=args.strict,
                           progress=progress)
    summary = write(args.out, rows, args, time.perf_counter() - t0)
    print(json.dumps(summary, indent=1))
    return 0


def write(path: str, rows: list[dict], args: argparse.Namespace, wall_s: float) -> dict:
    """Write the results of ``rows`` (all, or the ones done so far); returns the summary."""
    both = [r for r in rows if r["compiled"].get("xgrammar") and r["compiled"].get("llguidance")]
    diff = disagreements(rows)
    summary = {
        "schemas": len(rows), "both_compile": len(both),
        "llguidance_only": sum(r["compiled"].get("llguidance") is True
                               and r["compiled"].get("xgrammar") is False for r in rows),
        "llguidance_fails": sum(r["compiled"].get("llguidance") is False for r in rows),
        "instances_compared": sum(len(r["tests"]) for r in both),
        "schemas_disagreeing": len(diff),
        "instances_disagreeing": sum(len(d["tests"]) for d in diff),
        "disagreeing_by_file": dict(Counter(d["id"].split("---")[0] for d in diff)),
        "wall_s": round(wall_s, 1),
    }
    out = {"summary": summary, "disagreements": diff,
           "config": {"files": args.files, "limit": args.limit, "timeout_s": args.timeout,
                      "strict": args.strict, "tokenizer": "deepseek"},
           "machine": {"python": platform.python_version(), "cpus": __import__("os").cpu_count()},
           "rows": rows}
    with open(path, "w", encoding="utf-8") as fh:
        json.dump(out, fh, separators=(",", ":"))
    return summary


if __name__ == "__main__":
    sys.exit(main())
