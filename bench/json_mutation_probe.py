"""Does an engine accept an instance the schema rejects? Each MaskBench schema's first valid
instance, changed one place at a time (``portable_guided.harness.mutation``), walked through
the engine as the runtime compiles the schema; what it accepts must pass the ``jsonschema``
validator.

    PYTHONPATH=. python bench/json_mutation_probe.py --step 8 \
        --json bench/results/json_mutation_probe_s13.json
    PYTHONPATH=. python bench/json_mutation_probe.py --suite --seeds 4 \
        --json bench/results/json_mutation_probe_suite_s13.json

``--suite``: the JSON Schema Test Suite's groups instead (``--suite-dir``), each group's
first ``--seeds`` valid instances changed.
"""

from __future__ import annotations

import argparse
import glob
import json
import time
from pathlib import Path
from typing import Any

from portable_guided.harness.maskbench import load_records, write_results
from portable_guided.harness.mutation import probe_engine
from portable_guided.runtime import load_tokenizer_info

FILES = "../shared/data/maskbench/*.jsonl"
SUITE = "../shared/data/json-schema-test-suite/draft2020-12"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--files", default=FILES)
    p.add_argument("--step", type=int, default=None, help="every n-th schema (8; suite: 1)")
    p.add_argument("--per-instance", type=int, default=40, help="changes per valid instance")
    p.add_argument("--seeds", type=int, default=1, help="valid instances changed per schema")
    p.add_argument("--suite", action="store_true", help="the JSON Schema Test Suite instead")
    p.add_argument("--suite-dir", default=SUITE)
    p.add_argument("--strict", action="store_true", help="the strict variant (strict=True)")
    p.add_argument("--engines", default="xgrammar,llguidance")
    p.add_argument("--timeout", type=float, default=10.0)
    p.add_argument("--json", dest="out", default=None)
    args = p.parse_args()
    step = args.step or (1 if args.suite else 8)
    if args.suite:
        records = [{"id": f"{path.rsplit('/', 1)[-1]}#{i}", **group}
                   for path in sorted(glob.glob(f"{args.suite_dir}/*.json"))
                   for i, group in enumerate(json.loads(Path(path).read_text("utf-8")))
                   ][::step]
    else:
        records = load_records(sorted(glob.glob(args.files)))[::step]
    if not records:  # (a probe of nothing would report 0 accepted and look clean)
        where = args.suite_dir if args.suite else args.files
        p.error(f"no schemas found at {where!r} (run from the checkout, or pass the path)")
    info = load_tokenizer_info("deepseek")
    result: dict[str, Any] = {}
    for engine in args.engines.split(","):
        t0 = time.perf_counter()
        rows = probe_engine(records, info, engine, per_instance=args.per_instance,
                            seeds=args.seeds, strict=args.strict, timeout_s=args.timeout)
        bad = [r for r in rows if r["accepted_invalid"]]
        result[engine] = {
            "schemas_compiled": len(rows), "instances_tried": sum(r["tried"] for r in rows),
            "schemas_accepting_invalid": len(bad),
            "instances_accepted_invalid": sum(len(r["accepted_invalid"]) for r in bad),
            "accepted_invalid": [{"id": r["id"], "instances": r["accepted_invalid"][:5]}
                                 for r in bad],
            "seconds": round(time.perf_counter() - t0, 1)}
        print(engine, {k: v for k, v in result[engine].items() if k != "accepted_invalid"},
              flush=True)
        for r in bad:
            print("  ", r["id"], r["accepted_invalid"][:3], flush=True)
    if args.out:
        write_results(args.out, {"tokenizer": "deepseek", "schemas": len(records),
                                 "engines": result})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
