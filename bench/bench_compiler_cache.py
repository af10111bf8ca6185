"""xgrammar's compiler cache bound and the upgrade compiles: MaskBench schemas compiled one
after another on one xgrammar engine (as the runtime's engine upgrades run, its compiler
cache kept), once per bound, each in a fresh process: the total, the compile-time
percentiles and the schemas over 100 ms. The same schemas in the same order for every bound.

    PYTHONPATH=. python bench/bench_compiler_cache.py --skip 120 --limit 40 \\
        --bounds-mib 16 512 --json bench/results/compiler_cache_cpu.json
"""

from __future__ import annotations

import argparse
import glob
import json
import subprocess
import sys
import time
from typing import Any

import numpy as np

FILES = "../shared/data/maskbench/*.jsonl"


def run_one(bound_mib: int, skip: int, limit: int) -> dict[str, Any]:
    """Compile the schemas with the cache bounded at ``bound_mib`` (in this process)."""
    import logging

    from portable_guided.runtime import load_tokenizer_info
    from portable_guided.runtime.engines import xgrammar as xgrammar_engine
    from portable_guided.runtime.engines.xgrammar import XGrammarEngine

    logging.disable(logging.WARNING)
    xgrammar_engine.COMPILER_CACHE_BYTES = bound_mib << 20
    engine = XGrammarEngine.create(load_tokenizer_info("deepseek"))
    return {"bound_mib": bound_mib, **compiled_in_a_row(engine, skip, limit),
            "cache_mib": engine._compiler.get_cache_size_bytes() >> 20}


def compiled_in_a_row(engine: Any, skip: int, limit: int, files: str = FILES) -> dict[str, Any]:
    """Compile the schemas of the MaskBench-format files ``files`` (a glob; ``limit`` of each
    file after ``skip``) one after another on ``engine`` as upgrades do (the checks first,
    untimed): how many, the total, percentiles and the count over 30 and 100 ms."""
    from portable_guided.harness.maskbench import load_records
    from portable_guided.runtime import GrammarSpec

    times = []
    for path in sorted(glob.glob(files)):
        for rec in load_records([path])[skip:skip + limit]:
            try:
                prepared = engine.prepare(GrammarSpec.json_schema(rec["schema"]))
                t0 = time.perf_counter()
                engine.compile_prepared(prepared)
            except Exception:  # noqa: BLE001, S112 - refused or failed: not an upgrade
                continue
            times.append(time.perf_counter() - t0)
    ms = np.asarray(times) * 1e3
    return {"schemas": len(times), "total_s": round(ms.sum() / 1e3, 2),
            "p50_ms": round(float(np.percentile(ms, 50)), 2),
            "p90_ms": round(float(np.percentile(ms, 90)), 1),
            "p99_ms": round(float(np.percentile(ms, 99)), 1),
            "over_30ms": int((ms > 30).sum()), "over_100ms": int((ms > 100).sum())}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--skip", type=int, default=120, help="schemas skipped per file")
    ap.add_argument("--limit", type=int, default=40, help="schemas per file")
    ap.add_argument("--bounds-mib", type=int, nargs="+", default=[16, 512])
    ap.add_argument("--one", type=int, default=None, help=argparse.SUPPRESS)
    ap.add_argument("--json", default=None, help="write the results here")
    args = ap.parse_args()
    if args.one is not None:
        print(json.dumps(run_one(args.one, args.skip, args.limit)))
        return
    rows = []
    for bound in args.bounds_mib:
        out = subprocess.run([sys.executable, __file__, "--one", str(bound), "--skip",
                              str(args.skip), "--limit", str(args.limit)],
                             capture_output=True, text=True, check=True)
        rows.append(json.loads(out.stdout.strip().splitlines()[-1]))
        print(rows[-1], flush=True)
    if args.json:
        from portable_guided.harness.maskbench import machine_note, write_results

        write_results(args.json, {"command": " ".join(sys.argv), "date": time.strftime("%Y-%m-%d"),
                                  "machine": machine_note(), "tokenizer": "deepseek",
                                  "rows": rows})


if __name__ == "__main__":
    main()
