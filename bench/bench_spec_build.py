"""How long building a JSON-schema spec blocks its caller, side by side with the full
meta-schema check (``jsonschema``) that building ran inline before session 16.

For schemas just under ``DEFER_CHECK_ABOVE_CHARS`` (where the inline check was the most
expensive), each round times ``GrammarSpec.json_schema`` (what a caller pays now: the quick
proof ``meta_fast.proves_valid``, or a deferral) and ``specs._validate_meta`` (the full
check alone), alternating; medians.

Usage::

    .venv-cpu/bin/python bench/bench_spec_build.py [--rounds 5] [--json out.json]
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from portable_guided.runtime import GrammarSpec
from portable_guided.runtime.specs import DEFER_CHECK_ABOVE_CHARS, _validate_meta

CASES: dict[str, Callable[[int], Any]] = {
    "anyOf of {}": lambda n: {"anyOf": [{} for _ in range(n)]},
    "anyOf of {type: null}": lambda n: {"anyOf": [{"type": "null"} for _ in range(n)]},
    "nested items": lambda n: {"type": "array",
                               "items": {"anyOf": [{"items": {}} for _ in range(n)]}},
    "properties": lambda n: {"type": "object", "properties": {f"p{i}": {} for i in range(n)}},
    # Not proven by meta_fast (draft 2019-09): deferred to the compile job when large.
    "draft 2019-09 anyOf of {}": lambda n: {
        "$schema": "https://json-schema.org/draft/2019-09/schema",
        "anyOf": [{} for _ in range(n)]},
}


def _chars(schema: Any) -> int:
    return len(json.dumps(schema, separators=(",", ":")))


def just_under(make: Callable[[int], Any]) -> Any:
    """``make(n)`` for the largest ``n`` whose JSON stays within the inline-check limit."""
    low, high = 1, 2
    while _chars(make(high)) <= DEFER_CHECK_ABOVE_CHARS:
        low, high = high, high * 2
    while high - low > 1:
        mid = (low + high) // 2
        low, high = (mid, high) if _chars(make(mid)) <= DEFER_CHECK_ABOVE_CHARS else (low, mid)
    return make(low)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--json", default=None, help="write the results here")
    args = parser.parse_args(argv)
    rows = []
    print(f"{'schema':24} {'chars':>6} {'deferred':>8} {'build ms':>9} {'full check ms':>14}")
    for name, make in CASES.items():
        schema = just_under(make)
        build, check = [], []
        deferred = False
        for _ in range(args.rounds):
            start = time.perf_counter()
            deferred = GrammarSpec.json_schema(schema).deferred_check
            build.append(time.perf_counter() - start)
            start = time.perf_counter()
            _validate_meta(schema, "")
            check.append(time.perf_counter() - start)
        row = {"schema": name, "chars": _chars(schema), "deferred": deferred,
               "build_ms": round(statistics.median(build) * 1e3, 2),
               "full_check_ms": round(statistics.median(check) * 1e3, 1)}
        rows.append(row)
        print(f"{name:24} {row['chars']:>6} {deferred!s:>8} {row['build_ms']:>9.2f} "
              f"{row['full_check_ms']:>14.1f}", flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps({
            "command": " ".join([os.path.relpath(sys.executable), *sys.argv]),
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "machine": {"platform": platform.platform(), "cpus": os.cpu_count()},
            "rounds": args.rounds, "statistic": "median", "rows": rows,
        }, indent=1) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
