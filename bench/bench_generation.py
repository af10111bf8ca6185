"""Soundness by generation, full runs: random walks through each engine's masks for every
schema of a source, each finished text validated by ``jsonschema`` for the schema's draft
(``portable_guided.harness.generation``). Any invalid text is a failure.

    PYTHONPATH=. nice -n 10 python bench/bench_generation.py --source suite --engine llguidance
    PYTHONPATH=. nice -n 10 python bench/bench_generation.py --source maskbench \
        --engine xgrammar --files ../shared/data/maskbench/Github_easy.jsonl

Sources: ``suite`` (every draft's JSON Schema Test Suite groups, required and optional;
``--drafts`` picks some), ``maskbench`` (``--files``, taken round-robin over the files so that a run stopped
early covers each alike; ``done_by_file`` says how far), ``hypothesis`` (``--limit`` random
small schemas, 200 by default). Writes
``bench/results/generation_<source>_<engine>.json`` (``--out`` to change it; ``--tag``
appends to the name) with the command, machine, date, summary and every finding; a run
stopped early (Ctrl-C, ``--budget-s``) still writes what it did, marked ``partial``.
"""

from __future__ import annotations

import argparse
import datetime
import glob
import itertools
import json
import os
import platform
import signal
import sys
import time
from pathlib import Path
from typing import Any

from portable_guided.harness.generation import (
    DRAFTS,
    GenerationResult,
    MaskWalker,
    cross_accept,
    hypothesis_items,
    maskbench_items,
    run_generation,
    suite_items,
)
from portable_guided.runtime import load_tokenizer_info

FILES = "../shared/data/maskbench/*.jsonl"
RESULTS = Path(__file__).resolve().parent / "results"


def machine() -> dict[str, Any]:
    """Where the run was measured (the machine is shared: timings are rough)."""
    return {"uname": " ".join(platform.uname()), "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "note": "2-core machine shared with other engineers"}


def load_items(args: argparse.Namespace) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """The items of ``--source`` and a note of what they cover."""
    if args.source == "suite":
        drafts = args.drafts.split(",") if args.drafts else list(DRAFTS)
        items = [it for d in drafts for it in suite_items(d)]
        covered: dict[str, Any] = {"drafts": drafts}
    elif args.source == "maskbench":
        files = sorted(glob.glob(args.files))
        # Round-robin over the files: a run stopped early has covered each file alike.
        per_file = [[{**it, "file": os.path.basename(f)} for it in maskbench_items([f])]
                    for f in files]
        items = [it for group in itertools.zip_longest(*per_file) for it in group
                 if it is not None]
        covered = {"files": [os.path.basename(f) for f in files]}
    else:
        items = hypothesis_items(args.limit or 200, args.seed)
        covered = {"hypothesis_seed": args.seed}
    items = items[args.start:]
    if args.limit and args.source != "hypothesis":
        items = items[:args.limit]
    covered.update(start=args.start, items=len(items))
    return items, covered


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--source", choices=("suite", "maskbench", "hypothesis"), default="suite")
    p.add_argument("--engine", default="llguidance", help="xgrammar, llguidance or auto")
    p.add_argument("--drafts", default="", help="suite drafts, comma-separated (all)")
    p.add_argument("--files", default=FILES, help="MaskBench JSONL glob")
    p.add_argument("--walks", type=int, default=4, help="finished walks per schema")
    p.add_argument("--tries", type=int, default=3, help="at most walks*tries walks")
    p.add_argument("--limit", type=int, default=None, help="first n items (hypothesis: n)")
    p.add_argument("--start", type=int, default=0, help="skip the first n items")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--timeout", type=float, default=10.0, help="per-compile limit (s)")
    p.add_argument("--max-steps", type=int, default=400, help="a walk's token cap")
    p.add_argument("--soft-steps", type=int, default=48,
                   help="steps over which the bias toward ending grows (longer walks: more)")
    p.add_argument("--budget-s", type=float, default=None,
                   help="stop after this many seconds and write a partial result")
    p.add_argument("--metamorphic", action="store_true",
                   help="also the draft-7 / 2020-12 cross check on the schemas both read alike")
    p.add_argument("--tokenizer", default="smollm2")
    p.add_argument("--tag", default="")
    p.add_argument("--out", default=None)
    args = p.parse_args()
    items, covered = load_items(args)
    if not items:
        p.error("no schemas found (run from the checkout, or pass --files)")
    out = args.out or str(RESULTS / f"generation_{args.source}_{args.engine}{args.tag}.json")
    info = load_tokenizer_info(args.tokenizer)
    t0 = time.perf_counter()
    done: list[dict[str, Any]] = []
    partial = False

    def progress(row: dict[str, Any]) -> None:
        done.append(row)
        if len(done) % 100 == 0:
            print(f"{len(done)}/{len(items)} {time.perf_counter() - t0:.0f}s", flush=True)

    # SIGTERM (a scheduler's stop) ends the run as Ctrl-C does: results are written.
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    walker = MaskWalker(info, args.engine, timeout_s=args.timeout, max_steps=args.max_steps,
                        soft_steps=args.soft_steps)
    result: GenerationResult | None = None
    meta: list[dict[str, Any]] | None = None
    try:
        # Item by item, so that a stop keeps every finished item's result.
        result = GenerationResult(engine=args.engine)
        for item in items:
            if args.budget_s is not None and time.perf_counter() - t0 > args.budget_s:
                raise KeyboardInterrupt
            r = run_generation([item], walker, walks=args.walks, seed=args.seed,
                               tries=args.tries, progress=progress)
            _merge(result, r)
        if args.metamorphic:
            meta = cross_accept(items, walker, walks=args.walks, seed=args.seed)
    except KeyboardInterrupt:
        partial = True
    finally:
        walker.close()
    if result is None:
        return 1
    summary = result.summary()
    payload = {
        "command": " ".join(["python", *sys.argv]),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "machine": machine(), "tokenizer": args.tokenizer, "source": args.source,
        "covered": covered, "partial": partial, "items_done": len(done),
        "done_by_file": _by_file(done, items),
        "seconds": round(time.perf_counter() - t0, 1), "summary": summary,
        "failures": [vars(f) for f in result.failures],
        "dead_ends": result.dead_ends[:50],
        "mask_accept_mismatches": result.mask_accept_mismatches[:50],
        "engine_failures": result.engine_failures[:100],
        "validator_errors": result.validator_errors[:50],
        "duplicate_keys": result.duplicate_keys[:20],
        "remote_compiled": result.remote_compiled,
        "not_compiled": [{"id": r["id"], "status": r["status"], "error": r.get("error", "")}
                         for r in result.per_schema if r["status"] != "ok"],
    }
    if meta is not None:
        payload["metamorphic"] = meta
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    with open(out, "w", encoding="utf-8") as fh:
        json.dump(payload, fh, indent=1, ensure_ascii=False)
    print(json.dumps(summary), "partial" if partial else "", flush=True)
    print("wrote", out)
    return 0


def _by_file(done: list[dict[str, Any]], items: list[dict[str, Any]]) -> dict[str, list[int]]:
    """``{file: [schemas done, schemas in the file]}`` (a suite item's file is in its id:
    ``draft7/ref.json#3``)."""
    file_of = {str(it["id"]): str(it.get("file", str(it["id"]).split("#")[0])) for it in items}
    out: dict[str, list[int]] = {}
    for it in items:
        out.setdefault(file_of[str(it["id"])], [0, 0])[1] += 1
    for row in done:
        out.setdefault(file_of.get(str(row["id"]), "?"), [0, 0])[0] += 1
    return out


def _merge(into: GenerationResult, part: GenerationResult) -> None:
    """Add one item's result to the run's."""
    for name in ("schemas", "compiled", "refused", "empty", "timeouts", "remote_refused",
                 "walks_finished", "walks_unfinished", "tokens"):
        setattr(into, name, getattr(into, name) + getattr(part, name))
    for name in ("remote_compiled", "failures", "dead_ends", "mask_accept_mismatches",
                 "engine_failures", "validator_errors", "duplicate_keys", "per_schema"):
        getattr(into, name).extend(getattr(part, name))
    into.formats_unchecked.update(part.formats_unchecked)


if __name__ == "__main__":
    sys.exit(main())
