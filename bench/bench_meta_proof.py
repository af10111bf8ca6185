"""What the quick meta-schema proof (``json_schema.meta_fast.proves_valid``) saves on real
schemas, per declared draft: building a spec (``GrammarSpec.json_schema``, then the
deferred check if any) with the proof, side by side with the same build where the proof
is switched off (every schema then gets ``jsonschema``'s full meta-schema walk, as drafts
4, 6 and 7 did before the proof covered them). Alternating per schema; medians per draft.

Usage::

    .venv-cpu/bin/python bench/bench_meta_proof.py [--every 2] [--json out.json]

The schemas: every ``--every``-th MaskBench schema in ``../shared/data/maskbench``. The
build runs in the caller's thread in vLLM and SGLang (a compile job's first step).
"""

from __future__ import annotations

import argparse
import datetime
import glob
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from portable_guided.json_schema.dialects import dialect_of
from portable_guided.runtime import GrammarSpec
from portable_guided.runtime import specs as specs_module

MASKBENCH = "../shared/data/maskbench/*.jsonl"


def build(schema: Any) -> float:
    """Seconds to build ``schema``'s spec and run its deferred check (errors count too)."""
    t0 = time.perf_counter()
    try:
        spec = GrammarSpec.json_schema(schema)
        spec.run_deferred_check()
    except Exception:  # noqa: BLE001 - an invalid schema's refusal is timed alike
        return time.perf_counter() - t0
    return time.perf_counter() - t0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--files", default=MASKBENCH)
    ap.add_argument("--every", type=int, default=2, help="take every N-th schema")
    ap.add_argument("--json", dest="json_out", default=None)
    args = ap.parse_args()

    schemas = [json.loads(line)["schema"] for path in sorted(glob.glob(args.files))
               for line in Path(path).read_text(encoding="utf-8").split("\n")
               if line.strip()][::args.every]  # (not splitlines: U+2028 inside a string)
    proof = specs_module.proves_valid
    times: dict[str, dict[str, list[float]]] = {}
    proven: dict[str, int] = {}
    for schema in schemas:
        try:
            draft = dialect_of(schema).name
        except ValueError:
            continue
        row = times.setdefault(draft, {"with_proof": [], "full_check": []})
        proven[draft] = proven.get(draft, 0) + bool(proof(schema))
        row["with_proof"].append(build(schema))
        specs_module.proves_valid = lambda _schema: False
        try:
            row["full_check"].append(build(schema))
        finally:
            specs_module.proves_valid = proof
    rows = []
    for draft, row in sorted(times.items()):
        with_ms = statistics.median(row["with_proof"]) * 1e3
        full_ms = statistics.median(row["full_check"]) * 1e3
        rows.append({"draft": draft, "schemas": len(row["with_proof"]),
                     "proven": proven[draft], "build_ms_p50": round(with_ms, 3),
                     "full_check_build_ms_p50": round(full_ms, 3),
                     "build_ms_mean": round(statistics.fmean(row["with_proof"]) * 1e3, 3),
                     "full_check_build_ms_mean": round(
                         statistics.fmean(row["full_check"]) * 1e3, 3),
                     "speedup_p50": round(full_ms / with_ms, 2)})
        print(json.dumps(rows[-1]))
    if args.json_out:
        out = {"command": " ".join([os.path.basename(sys.executable), *sys.argv]),
               "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
               "machine": {"platform": platform.platform(), "cpus": os.cpu_count()},
               "statistic": "median (and mean) per draft", "rows": rows}
        Path(args.json_out).write_text(json.dumps(out, indent=1) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
