"""The runtime's start-up prewarm of xgrammar's shared token masks
(``engines/xgrammar_prewarm.py``): MaskBench schemas compiled one after another on one
xgrammar engine (as the runtime's engine upgrades run), without the prewarm and after it,
each in a fresh process: the total, the compile-time percentiles and the schemas over 30
and 100 ms, and what the prewarm itself cost (seconds, compiler-cache MiB). The same
schemas in the same order both ways. ``--cache-mib 512,1024`` runs the prewarmed way once
per bound of xgrammar's compiler cache (``COMPILER_CACHE_BYTES``; default: the engine's).
``--ways cold,prewarmed,whole`` adds the prewarmed way with a way out of several letters
written as one rule of its own (``whole``: no shared pieces, ``xgrammar_free_names``, and
none warmed), as before session 34; ``unmerged``: prewarmed, with equal free-name tries
compiled once each (``merge_equal_tries`` off), as before session 35.

    PYTHONPATH=. python bench/bench_prewarm.py --skip 120 --limit 40 \\
        --json bench/results/prewarm_cpu.json
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from typing import Any

from bench_compiler_cache import FILES, compiled_in_a_row  # (this script's folder is on the path)


def run_one(prewarmed: bool, skip: int, limit: int, tokenizer: str, files: str,
            cache_mib: int | None = None, pieces: bool = True,
            merged: bool = True) -> dict[str, Any]:
    """Compile the schemas on a new engine (in this process), after the prewarm or not,
    its compiler cache bounded at ``cache_mib`` (None: the engine's default); ``pieces``
    False: ways out of several letters as rules of their own, none warmed; ``merged``
    False: equal free-name tries each compiled."""
    import logging

    from portable_guided.runtime import load_tokenizer_info
    from portable_guided.runtime.engines import xgrammar as xgrammar_engine
    from portable_guided.runtime.engines import xgrammar_free_names, xgrammar_prewarm
    from portable_guided.runtime.engines.xgrammar_prewarm import prewarm

    logging.disable(logging.WARNING)
    if not pieces:
        xgrammar_free_names.way_out_pieces = lambda excluded: None  # type: ignore[assignment]
        xgrammar_prewarm.free_name_piece_schemas = lambda: iter(())  # type: ignore[assignment]
    if not merged:
        xgrammar_free_names.merge_equal_tries = lambda ebnf: ebnf  # type: ignore[assignment]
    if cache_mib is not None:
        xgrammar_engine.COMPILER_CACHE_BYTES = cache_mib << 20
    engine = xgrammar_engine.XGrammarEngine.create(load_tokenizer_info(tokenizer))
    row: dict[str, Any] = {"prewarm": prewarmed, "pieces": pieces, "merged": merged,
                           "cache_mib": xgrammar_engine.COMPILER_CACHE_BYTES >> 20}
    if prewarmed:
        t0 = time.perf_counter()
        compiled, failed = prewarm(engine)
        row |= {"prewarm_s": round(time.perf_counter() - t0, 1), "prewarm_compiled": compiled,
                "prewarm_failed": failed,
                "prewarm_cache_mib": engine._compiler.get_cache_size_bytes() >> 20}
    return row | compiled_in_a_row(engine, skip, limit, files)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--skip", type=int, default=120, help="schemas skipped per file")
    ap.add_argument("--limit", type=int, default=40, help="schemas per file")
    ap.add_argument("--tokenizer", default="deepseek")
    ap.add_argument("--files", default=FILES, help="a glob of MaskBench-format files "
                    "(default: MaskBench's; e.g. JSONSchemaBench's joined by "
                    "bench_engine_choice.py --jsb-dir)")
    ap.add_argument("--cache-mib", default=None,
                    help="comma-separated bounds of xgrammar's compiler cache, in MiB: the "
                    "prewarmed way runs once per bound (default: the engine's)")
    ap.add_argument("--ways", default="cold,prewarmed",
                    help="comma-separated: cold, prewarmed (once per --cache-mib bound), "
                    "whole (prewarmed, no shared pieces of a way out of several letters), "
                    "unmerged (prewarmed, equal free-name tries each compiled)")
    ap.add_argument("--one", choices=["cold", "prewarmed", "whole", "unmerged"],
                    help=argparse.SUPPRESS)
    ap.add_argument("--json", default=None, help="write the results here")
    args = ap.parse_args()
    if args.one is not None:
        mib = None if args.cache_mib is None else int(args.cache_mib)
        print(json.dumps(run_one(args.one != "cold", args.skip, args.limit,
                                 args.tokenizer, args.files, mib, pieces=args.one != "whole",
                                 merged=args.one != "unmerged")))
        return
    rows = []
    bounds = [None] if args.cache_mib is None else args.cache_mib.split(",")
    chosen = args.ways.split(",")
    ways = [(way, bound) for way in chosen
            for bound in (bounds if way == "prewarmed" else [None])]
    for way, bound in ways:
        out = subprocess.run([sys.executable, __file__, "--one", way, "--skip", str(args.skip),
                              "--limit", str(args.limit), "--tokenizer", args.tokenizer,
                              "--files", args.files,
                              *(["--cache-mib", bound] if bound is not None else [])],
                             capture_output=True, text=True, check=True)
        rows.append(json.loads(out.stdout.strip().splitlines()[-1]))
        print(rows[-1], flush=True)
    if args.json:
        from portable_guided.harness.maskbench import machine_note, write_results

        write_results(args.json, {"command": " ".join(sys.argv), "date": time.strftime("%Y-%m-%d"),
                                  "machine": machine_note(), "tokenizer": args.tokenizer,
                                  "rows": rows})


if __name__ == "__main__":
    main()
