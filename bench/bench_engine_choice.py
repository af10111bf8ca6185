"""Which engine should be the default: every runtime engine mode and raw xgrammar (as vLLM
calls it) on the same schemas, file by file in a new random mode order each file (so a
machine that gets busier mid-run weighs on every mode alike).

    python bench/bench_engine_choice.py --limit 25 --timeout 10 \\
        --files ../shared/data/maskbench/*.jsonl /tmp/jsb/Github_hard.jsonl \\
        /tmp/jsb/Github_ultra.jsonl --out bench/results/engine_choice_cpu.json

Github_hard and Github_ultra are JSONSchemaBench collections outside the shared development
split (guidance-ai/jsonschemabench, maskbench/data, commit ba103c73: one JSON file per
schema, joined into one JSONL file per collection, as ``--jsb-dir`` does).

Per mode: schemas passing every test, invalid instances accepted (0 required), compile time
p50/p90/p99 over the compiled schemas and "ready" p50/p99 over all schemas (a time-out
counted as the limit, what a request waits), mask time p50/p99 over the first requests of
each schema, and per engine that served them (``mask_engines``: under ``auto`` a first
request starts on llguidance and may move to xgrammar when the upgrade lands; per schema,
``mask_us_max`` and the masks over 200 us by engine). ``--warm-wait S`` adds the steady state: each schema's valid instances walked
again as later requests, after up to S seconds for the runtime's engine upgrade (``auto``
moves a repeated schema to xgrammar in the background), ``warm_mask_us_p50/p99`` and which
engine served them (``warm_engines``). ``--step-ms MS`` spaces the first requests' masks
as a server's decode steps do while the schema's upgrade runs (a request moves to the
upgraded grammar at its next mask: docs/latency.md); without it they come back to back,
which no server does. ``--pace-ms MS`` sleeps after every first-request token in every mode,
raw ones included: the same decode step for all (a mask after an idle wait of 10 ms costs
several times one right after another here, for raw xgrammar too), and the fair comparison
of first-request masks. ``--interleave`` has the modes take turns schema by schema (each
schema's mode order random), so that a slow spell of this shared machine, which can move a
mode's p99 by half between two runs, falls on every mode alike.
"""

from __future__ import annotations

import argparse
import json
import random
import subprocess
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np

from portable_guided.harness.maskbench import (
    ModeRun,
    load_records,
    mask_engines,
    run_mode,
    summarize,
    write_results,
)
from portable_guided.runtime import compile_service, load_tokenizer_info

MODES = ("runtime:xgrammar", "runtime:llguidance", "runtime:auto", "raw:xgrammar")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--files", nargs="*", default=[])
    ap.add_argument("--jsb-dir", help="a jsonschemabench checkout: add its Github_hard and "
                    "Github_ultra collections (joined into JSONL under --work)")
    ap.add_argument("--work", default="/tmp/engine_choice")
    ap.add_argument("--modes", default=",".join(MODES))
    ap.add_argument("--limit", type=int, default=25, help="first N schemas of each file")
    ap.add_argument("--skip", type=int, default=0,
                    help="leave out the first N schemas of each file (another sample)")
    ap.add_argument("--timeout", type=float, default=10.0)
    ap.add_argument("--tokenizer", default="deepseek")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--warm-wait", type=float, default=None,
                    help="also walk each schema's valid instances again as later requests, "
                    "after waiting up to this many seconds for the runtime's engine upgrade")
    ap.add_argument("--step-ms", type=float, default=0.0,
                    help="the first requests' decode step: after each token, sleep this "
                    "long while the schema's engine upgrade runs (default 0: masks back to "
                    "back)")
    ap.add_argument("--pace-ms", type=float, default=0.0,
                    help="after every first-request token, in every mode, sleep this long "
                    "(the same decode step for all modes; overrides --step-ms)")
    ap.add_argument("--upgrade-limit-s", type=float, default=None,
                    help="the engine upgrade's compile limit (default: the runtime's "
                    "UPGRADE_LIMIT_S)")
    ap.add_argument("--interleave", action="store_true",
                    help="the modes take turns schema by schema (in a random order each "
                    "time), all alive at once, instead of one mode over a whole file then "
                    "the next: a slow spell of a shared machine falls on every mode alike")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()

    if args.upgrade_limit_s is not None:
        compile_service.UPGRADE_LIMIT_S = args.upgrade_limit_s
    files = list(args.files)
    if args.jsb_dir:
        files += _join_jsb(Path(args.jsb_dir), Path(args.work))
    modes = args.modes.split(",")
    info = load_tokenizer_info(args.tokenizer)
    rng = random.Random(args.seed)
    per_mode: dict[str, list[dict[str, Any]]] = {m: [] for m in modes}
    masks: dict[str, list[float]] = {m: [] for m in modes}
    served: dict[str, list[str]] = {m: [] for m in modes}
    warm: dict[str, list[float]] = {m: [] for m in modes}
    for path in files:
        records = load_records([path], limit=args.skip + args.limit)[args.skip:]
        order = modes[:]
        rng.shuffle(order)
        options = {"timeout_s": args.timeout, "warm_wait_s": args.warm_wait,
                   "step_s": args.step_ms / 1e3, "pace_s": args.pace_ms / 1e3}
        results = (_interleaved(modes, records, info, rng, options) if args.interleave
                   else {mode: run_mode(mode, records, info, **options) for mode in order})
        for mode, result in results.items():
            for row in result["per_schema"]:
                row["file"] = Path(path).stem
            per_mode[mode].extend(result["per_schema"])
            masks[mode].extend(result["mask_times"])
            served[mode].extend(result["served_by"])
            warm[mode].extend(result["warm_mask_times"])
            print(f"{Path(path).stem:24s} {mode:20s} {result['summary']['passing']}/"
                  f"{result['summary']['schemas']} passing", flush=True)
    summaries = {m: _summary(rows, masks[m], warm[m], args.timeout)
                 | {"mask_engines": mask_engines(masks[m], served[m])}
                 for m, rows in per_mode.items()}
    write_results(args.out, {"files": files, "limit_per_file": args.limit,
                             "skip_per_file": args.skip,
                             "timeout_s": args.timeout, "tokenizer": args.tokenizer,
                             "summary": summaries, "per_schema": per_mode})
    for mode, s in summaries.items():
        print(mode, json.dumps(s))


def _interleaved(modes: list[str], records: list[dict[str, Any]], info: Any,
                 rng: random.Random, options: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Each mode's ``run_mode`` result, the modes taking turns schema by schema."""
    runs: dict[str, ModeRun] = {}
    try:
        for mode in modes:
            runs[mode] = ModeRun(mode, info, **options)
        for rec in records:
            order = modes[:]
            rng.shuffle(order)
            for mode in order:
                runs[mode].add(rec)
    finally:
        for run in runs.values():
            run.close()
    return {mode: run.result() for mode, run in runs.items()}


def _summary(rows: list[dict[str, Any]], mask_times: list[float], warm_times: list[float],
             timeout_s: float) -> dict[str, Any]:
    compiled = [r["compile_ms"] / 1e3 for r in rows if "compile_ms" in r]
    out = summarize(rows, compiled, mask_times)
    if warm_times:
        # Later requests of each schema (the steady state of a schema served repeatedly).
        out.update(warm_mask_us_p50=float(np.percentile(warm_times, 50)) * 1e6,
                   warm_mask_us_p99=float(np.percentile(warm_times, 99)) * 1e6,
                   warm_tokens=len(warm_times),
                   warm_valid_rejected=sum(r.get("warm_valid_rejected", 0) for r in rows),
                   warm_engines=dict(Counter(r["warm_engine"] for r in rows
                                             if "warm_engine" in r)))
    ready = [r["compile_ms"] / 1e3 if "compile_ms" in r
             else timeout_s if r["status"] == "timeout" else 0.0 for r in rows]
    out.update({f"ready_ms_p{q}": float(np.percentile(ready, q)) * 1e3 for q in (50, 90, 99)})
    return out


def _join_jsb(root: Path, work: Path) -> list[str]:
    work.mkdir(parents=True, exist_ok=True)
    names = subprocess.run(["git", "-C", str(root), "ls-tree", "-r", "--name-only", "HEAD",
                            "maskbench/data"], capture_output=True, text=True,
                           check=True).stdout.split()
    out = []
    for collection in ("Github_hard", "Github_ultra"):
        target = work / f"{collection}.jsonl"
        with open(target, "w", encoding="utf-8") as fh:
            for name in names:
                base = name.rsplit("/", 1)[1]
                if base.startswith(collection + "---"):
                    rec = json.loads(subprocess.run(
                        ["git", "-C", str(root), "show", f"HEAD:{name}"], capture_output=True,
                        text=True, check=True).stdout)
                    rec.setdefault("id", base.removesuffix(".json"))
                    fh.write(json.dumps(rec) + "\n")
        out.append(str(target))
    return out


if __name__ == "__main__":
    main()
