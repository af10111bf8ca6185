"""What the JSON-schema lowering costs at compile time: per MaskBench schema, the engine's
compile of the schema as written vs the lowering plus the compile of its result, side by side
(interleaved, each the median of ``--repeat`` runs, compiler caches off).

    PYTHONPATH=. python bench/bench_lowering.py --sample 400 \
        --json bench/results/lowering_compile_cpu.json

Only schemas that both forms compile on an engine count for it (the lowering also turns
refused schemas into compiled ones; that is coverage, measured by ``bench maskbench``).
Reported over all pairs and over the schemas the lowering rewrites (the others reach the
engine as written, after one cheap walk).
Schemas whose first compile takes over ``--max-s`` are skipped (xgrammar's tail).
"""

from __future__ import annotations

import argparse
import datetime
import json
import statistics
import sys
import time
from typing import Any

from portable_guided.harness.maskbench import load_records, machine_note
from portable_guided.runtime import load_tokenizer_info
from portable_guided.runtime.json_lowering import engine_schema_text

FILES = "../shared/data/maskbench/*.jsonl"


def _compilers(info: Any) -> dict[str, Any]:
    import llguidance as llg
    import xgrammar as xgr

    from portable_guided.runtime.engines import llguidance as llg_engine
    from portable_guided.runtime.engines import xgrammar as xgr_engine

    xc = xgr.GrammarCompiler(xgr_engine.tokenizer(info), max_threads=1, cache_enabled=False)
    ltok = llg_engine.tokenizer(info)

    def xgrammar(text: str) -> None:
        xc.compile_json_schema(text, any_whitespace=True, strict_mode=False)

    def llguidance(text: str) -> None:
        grammar = llg.LLMatcher.grammar_from_json_schema(
            text, defaults={"whitespace_flexible": True, "coerce_one_of": True})
        m = llg.LLMatcher(ltok, grammar, log_level=0)
        if m.is_error():
            raise ValueError(m.get_error())

    return {"xgrammar": xgrammar, "llguidance": llguidance}


def _timed(fn: Any, *args: Any) -> float:
    t0 = time.perf_counter()
    fn(*args)
    return time.perf_counter() - t0


def _summary(rs: list[dict[str, Any]]) -> dict[str, Any]:
    if not rs:
        return {"pairs": 0}
    raw_p50 = statistics.median(r["raw_ms"] for r in rs)
    low_p50 = statistics.median(r["lowered_ms"] for r in rs)
    return {"pairs": len(rs), "raw_ms_p50": round(raw_p50, 3),
            "lowered_ms_p50": round(low_p50, 3), "ratio_of_p50": round(low_p50 / raw_p50, 3),
            "lowering_ms_p50": round(statistics.median(r["lowering_ms"] for r in rs), 3),
            "lowered_compile_ms_p50": round(statistics.median(
                r["lowered_compile_ms"] for r in rs), 3),
            "per_schema_ratio_p50": round(statistics.median(
                r["lowered_ms"] / r["raw_ms"] for r in rs), 3)}


def main() -> int:
    import glob

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--files", default=FILES)
    p.add_argument("--sample", type=int, default=400, help="schemas, evenly spaced")
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--max-s", type=float, default=2.0)
    p.add_argument("--engines", default="xgrammar,llguidance")
    p.add_argument("--json", dest="out", default=None)
    args = p.parse_args()
    records = load_records(sorted(glob.glob(args.files)))
    step = max(1, len(records) // args.sample)
    records = records[::step][: args.sample]
    info = load_tokenizer_info("deepseek")
    compilers = {k: v for k, v in _compilers(info).items() if k in args.engines.split(",")}
    rows: dict[str, list[dict[str, Any]]] = {name: [] for name in compilers}
    lower_s: list[float] = []
    refused: dict[str, int] = {}
    for rec in records:
        schema = rec["schema"]
        as_written = json.dumps(schema, ensure_ascii=False, separators=(",", ":"))

        def lowered_text(text: str = as_written) -> str:
            # What the runtime does per new schema (its cache bypassed).
            return str(engine_schema_text.__wrapped__(text))

        text = lowered_text()
        lower_s.append(statistics.median(_timed(lowered_text) for _ in range(args.repeat)))
        for name, compile_ in compilers.items():
            try:
                first = _timed(compile_, as_written)
                if first > args.max_s:
                    continue
                _timed(compile_, text)
            except Exception:  # noqa: BLE001 - one form refused: not a timing pair
                refused[name] = refused.get(name, 0) + 1
                continue
            raw, low, lowering, compiled = [], [], [], []
            for _ in range(args.repeat):  # interleaved
                raw.append(_timed(compile_, as_written))
                lowering.append(_timed(lowered_text))
                compiled.append(_timed(compile_, text))
                low.append(lowering[-1] + compiled[-1])
            rows[name].append({"id": rec["id"], "raw_ms": statistics.median(raw) * 1e3,
                               "lowered_ms": statistics.median(low) * 1e3,
                               # the two parts of lowered_ms
                               "lowering_ms": statistics.median(lowering) * 1e3,
                               "lowered_compile_ms": statistics.median(compiled) * 1e3,
                               "rewritten": text != as_written})
    out: dict[str, Any] = {
        "command": " ".join(["python", *sys.argv]), "date": datetime.date.today().isoformat(),
        "machine": machine_note(), "tokenizer": "deepseek", "schemas_sampled": len(records),
        "lowering_ms_p50": statistics.median(lower_s) * 1e3 if lower_s else None,
        "not_paired_refused": refused,
        "engines": {},
    }
    for name, rs in rows.items():
        if not rs:
            continue
        out["engines"][name] = {"all": _summary(rs),
                                "rewritten": _summary([r for r in rs if r["rewritten"]]),
                                "rows": rs}
        print(name, "all", out["engines"][name]["all"])
        print(name, "rewritten only", out["engines"][name]["rewritten"])
    print("lowering ms p50", out["lowering_ms_p50"])
    if args.out:
        with open(args.out, "w", encoding="utf-8") as fh:
            json.dump(out, fh, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
