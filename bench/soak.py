"""Soak: thousands of requests over mixed MaskBench schemas; is memory flat after warm-up?

    python bench/soak.py --requests 6000 --json bench/results/soak_cpu.json

Requests run in lockstep batches (``--batch`` live requests; each walks its schema's valid
instance token by token: ``fill_bitmask`` for the batch, then one ``accept`` per request, then
the stop token; a finished request is replaced by a new one on a random schema). The memory
cache is bounded below the pool's size (``--cache-mb``), so compiled grammars are evicted and
compiled again throughout. Resident memory (VmRSS) of this process and of the compile
workers is sampled every ``--every`` requests; the verdict compares the second half of the run
with the first sample after warm-up. Every request must end as its schema's test says (the
whole valid instance accepted, then the stop token): ``unexpected_outcomes`` counts the rest.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import random
import sys
import time

from portable_guided.harness.maskbench import load_records
from portable_guided.runtime import GrammarRuntime, GrammarSpec, load_tokenizer_info

DATA = os.environ.get("PORTABLE_GUIDED_MASKBENCH", "/work/shared/data/maskbench")
FILES = ("Github_easy", "Github_trivial", "Glaiveai2K", "JME", "BFCL_simple", "MCPspec")


def rss_mb(pid: int) -> float:
    """Resident set size of ``pid`` in MiB (0 if it is gone)."""
    try:
        with open(f"/proc/{pid}/status") as fh:
            for line in fh:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
    except FileNotFoundError:
        pass
    return 0.0


def pool(info, per_file: int, rng: random.Random) -> list[tuple[GrammarSpec, list[int]]]:
    """(spec, token ids of a valid instance) for schemas whose instance llguidance accepts."""
    out = []
    records = load_records([f"{DATA}/{name}.jsonl" for name in FILES], per_file)
    for rec in records:
        valid = [t["data"] for t in rec.get("tests", []) if t["valid"]]
        if not valid:
            continue
        try:
            spec = GrammarSpec.json_schema(rec["schema"])
        except (ValueError, TypeError):  # an invalid schema: not in the pool
            continue
        out.append((spec, info.encode(json.dumps(valid[0], ensure_ascii=False))))
    rng.shuffle(out)
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--requests", type=int, default=6000)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--per-file", type=int, default=60, help="schemas taken from each file")
    p.add_argument("--engine", default="auto")
    p.add_argument("--cache-mb", type=float, default=24.0)
    p.add_argument("--every", type=int, default=250)
    p.add_argument("--warmup", type=int, default=1500, help="requests before the baseline")
    p.add_argument("--json", dest="out", required=True)
    args = p.parse_args()
    rng = random.Random(0)
    info = load_tokenizer_info("deepseek")
    rt = GrammarRuntime(info, args.engine, compile_timeout_s=10.0,
                        cache_bytes=int(args.cache_mb * 2**20))
    # Keep only schemas the engines compile and walk (a failed request would end at once).
    candidates = pool(info, args.per_file, rng)
    specs = []
    for spec, ids in candidates:
        req = rt.new_request(spec, on_error="reject").wait(60)
        if not req.failed and req.accept_tokens(ids) == len(ids):
            specs.append((spec, ids))
    stop = info.stop_token_ids[0]
    bm = rt.allocate_bitmask(args.batch)
    live: list[list] = []
    started = finished = unexpected = 0
    samples = []
    t0 = time.perf_counter()

    def new() -> list:
        nonlocal started
        started += 1
        spec, ids = specs[rng.randrange(len(specs))]
        return [rt.new_request(spec, on_error="reject"), ids, 0]

    while finished < args.requests:
        while len(live) < args.batch and started < args.requests:
            live.append(new())
        for item in live:
            item[0].wait(60)
        rt.fill_bitmask([item[0] for item in live], bm)
        still = []
        for item in live:
            req, ids, pos = item
            if pos < len(ids):
                ok = req.accept(ids[pos])
                item[2] += 1
            else:
                ok = req.accept(stop)
            if not ok or req.is_terminated:
                finished += 1
                # Every pooled schema walks its valid instance to the end: anything else
                # (a rejection, a failure, an early end) is an outcome change.
                if not (ok and pos == len(ids) and req.is_terminated and not req.failed):
                    unexpected += 1
                if finished % args.every == 0:
                    gc.collect()
                    workers = sum(rss_mb(pid) for pid in rt.worker_pids())
                    m = rt.metrics()
                    samples.append({"requests": finished, "s": round(time.perf_counter() - t0, 1),
                                    "rss_mb": round(rss_mb(os.getpid()), 1),
                                    "workers_rss_mb": round(workers, 1),
                                    "cache_mb": round(m["cache_bytes"] / 2**20, 2),
                                    "compiles": m["compiles"], "fill_steps": m["fill_steps"]})
                    print(json.dumps(samples[-1]), file=sys.stderr, flush=True)
            else:
                still.append(item)
        live = still
    metrics = rt.metrics()
    rt.close()
    base = next(s for s in samples if s["requests"] >= args.warmup)
    tail = [s for s in samples if s["requests"] > (args.requests + args.warmup) / 2]
    growth = max(s["rss_mb"] for s in tail) - base["rss_mb"]
    out = {
        "summary": {"requests": args.requests, "schemas": len(specs), "engine": args.engine,
                    "batch": args.batch, "cache_mb": args.cache_mb,
                    "baseline_after_warmup": base,
                    "rss_mb_max_second_half": max(s["rss_mb"] for s in tail),
                    "rss_growth_mb_after_warmup": round(growth, 1),
                    "rss_mb_first_sample": samples[0]["rss_mb"],
                    "compiles": metrics["compiles"], "tokens_accepted": metrics["tokens_accepted"],
                    "fill_steps": metrics["fill_steps"], "unexpected_outcomes": unexpected,
                    "wall_s": round(time.perf_counter() - t0, 1)},
        "samples": samples,
        "machine": {"python": platform.python_version(), "cpus": os.cpu_count(),
                    "machine": platform.machine()},
        "command": " ".join(["python", "bench/soak.py", *sys.argv[1:]]),
    }
    with open(args.out, "w", encoding="utf-8") as fh:
        json.dump(out, fh, indent=1)
    print(json.dumps(out["summary"], indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
