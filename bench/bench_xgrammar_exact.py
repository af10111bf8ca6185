"""Compile time of our exact xgrammar rules (``runtime/xgrammar_exact.py``) against the forms
they replace, side by side on the same schemas: MaskBench schemas whose xgrammar input the
rules change (ranged numbers; ``minLength`` strings up to 16), each compiled cold (compiler
cache cleared) alternating old/new, best of ``--repeat``; median and p90 of new/old.

    PYTHONPATH=. python bench/bench_xgrammar_exact.py --sample 40 --json out.json
"""

from __future__ import annotations

import argparse
import glob
import statistics
import time
from typing import Any

from portable_guided.harness.maskbench import load_records, machine_note, write_results
from portable_guided.json_schema import xgrammar_forms
from portable_guided.runtime import GrammarSpec, load_tokenizer_info, xgrammar_exact
from portable_guided.runtime.engines.base import EmptyLanguage, UnsupportedSpec
from portable_guided.runtime.engines.xgrammar import XGrammarEngine
from portable_guided.runtime.errors import GrammarSpecError

FILES = "../shared/data/maskbench/*.jsonl"
_RANGE = xgrammar_exact._range
_MIN = xgrammar_exact.MAX_ESCAPED_MIN_LENGTH


def _mode(kind: str, exact: bool) -> None:
    """Switch one kind of exact rule on or off (off: xgrammar's own form, as before)."""
    if kind == "numbers":
        xgrammar_exact._range = _RANGE if exact else (lambda node: None)  # type: ignore[assignment]
    else:
        value = _MIN if exact else 0
        xgrammar_forms.MAX_ESCAPED_MIN_LENGTH = value  # type: ignore[misc]
        xgrammar_exact.MAX_ESCAPED_MIN_LENGTH = value  # type: ignore[misc]


def measure(engine: XGrammarEngine, records: list[dict[str, Any]], kind: str, sample: int,
            repeat: int) -> dict[str, Any]:
    pairs = []
    for rec in records:
        try:
            _mode(kind, True)
            new = engine.prepare(GrammarSpec.json_schema(rec["schema"]))
            _mode(kind, False)
            old = engine.prepare(GrammarSpec.json_schema(rec["schema"]))
        except (UnsupportedSpec, EmptyLanguage, GrammarSpecError):  # refused: nothing to compare
            continue
        _mode(kind, True)
        # (numbers: the prepared text is the same; the rule goes in at compile time)
        if old != new or xgrammar_exact.exact_placeholders(new[0], {}) != new[0]:
            pairs.append((rec["id"], old, new))
    rows = []
    for rid, old, new in pairs[::max(1, len(pairs) // sample)]:
        times: dict[str, list[float]] = {"old": [], "new": []}
        try:
            for _ in range(repeat):
                for side in ("old", "new"):
                    _mode(kind, side == "new")
                    engine._compiler.clear_cache()
                    t0 = time.perf_counter()
                    engine.compile_prepared(old if side == "old" else new)
                    times[side].append(time.perf_counter() - t0)
        except RuntimeError:  # xgrammar rejects some itself (a false subschema): not timed
            continue
        rows.append({"id": rid, "old_ms": min(times["old"]) * 1e3,
                     "new_ms": min(times["new"]) * 1e3})
    _mode(kind, True)
    ratios = sorted(r["new_ms"] / r["old_ms"] for r in rows)
    return {"schemas_changed": len(pairs), "schemas_timed": len(rows),
            "ratio_p50": statistics.median(ratios), "ratio_p90": ratios[int(len(ratios) * 0.9)],
            "ratio_max": ratios[-1],
            "old_ms_p50": statistics.median(r["old_ms"] for r in rows),
            "new_ms_p50": statistics.median(r["new_ms"] for r in rows), "rows": rows}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--files", default=FILES)
    p.add_argument("--sample", type=int, default=40, help="schemas timed per kind")
    p.add_argument("--repeat", type=int, default=2)
    p.add_argument("--json", dest="out", default=None)
    args = p.parse_args()
    records = load_records(sorted(glob.glob(args.files)))
    if not records:
        p.error(f"no schemas found at {args.files!r}")
    engine = XGrammarEngine.create(load_tokenizer_info("deepseek", vocab_size=129_344))
    result = {}
    for kind in ("numbers", "strings"):
        result[kind] = measure(engine, records, kind, args.sample, args.repeat)
        print(kind, {k: v for k, v in result[kind].items() if k != "rows"}, flush=True)
    if args.out:
        write_results(args.out, {"command": "PYTHONPATH=. python bench/bench_xgrammar_exact.py "
                                            f"--sample {args.sample} --repeat {args.repeat}",
                                 "machine": machine_note(), "tokenizer": "deepseek",
                                 "kinds": result})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
