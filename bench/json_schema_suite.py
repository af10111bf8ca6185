"""The JSON Schema Test Suite (draft 2020-12) per engine: schemas compiled, instances decided
right, invalid instances accepted.

    PYTHONPATH=. python bench/json_schema_suite.py \
        --json bench/results/json_schema_suite.json [--engines xgrammar,llguidance,auto]

``--draft draft4`` (``draft6``, ``draft7``, ``draft2019-09``) runs that draft's suite from
tests/data instead, required and optional tests (``optional/format`` left out), each group's
schema given the draft's ``$schema`` where it names none.

SmolLM2 tokenizer; each instance ``json.dumps``-ed, walked token by token, then the stop token
(``portable_guided.harness.schema_suite``).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import sys
import time

from portable_guided.harness.maskbench import machine_note
from portable_guided.harness.schema_suite import load_suite, run_suite, summarize_suite
from portable_guided.runtime import load_tokenizer_info

SUITE = "../shared/data/json-schema-test-suite/draft2020-12"
DRAFTS = "tests/data/json-schema-test-suite"


def load_draft(name: str) -> list[dict]:
    """The groups of draft ``name``'s suite (required, then ``optional/``), each schema
    naming the draft in ``$schema`` (a group's schema is read under its folder's draft)."""
    from portable_guided.json_schema.dialects import by_name

    uri = by_name(name).uri
    folder = os.path.join(DRAFTS, name)
    groups = load_suite(folder)
    for group in load_suite(os.path.join(folder, "optional")):
        groups.append({**group, "id": "optional/" + group["id"]})
    for group in groups:
        if isinstance(group["schema"], dict) and "$schema" not in group["schema"]:
            group["schema"] = {"$schema": uri, **group["schema"]}
    return groups


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--suite", default=SUITE)
    p.add_argument("--draft", default=None,
                   choices=["draft4", "draft6", "draft7", "draft2019-09"],
                   help="run this draft's suite (tests/data) instead of --suite")
    p.add_argument("--json", dest="out", default=None)
    p.add_argument("--engines", default="xgrammar,llguidance,auto")
    p.add_argument("--timeout", type=float, default=5.0)
    p.add_argument("--rows", action="store_true", help="print every group's row")
    args = p.parse_args()
    groups = load_draft(args.draft) if args.draft else load_suite(args.suite)
    info = load_tokenizer_info("smollm2")
    out: dict = {"command": " ".join(["python", *sys.argv]),
                 "date": datetime.date.today().isoformat(),
                 "machine": {**machine_note(), "platform": platform.platform()},
                 "tokenizer": "smollm2", "timeout_s": args.timeout,
                 "suite": args.draft or args.suite, "engines": {}}
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
