"""Compile time of open objects on the xgrammar engine with the ways out of declared names
shared (``runtime/engines/xgrammar_free_names.py``) against xgrammar's own trie, side by
side on the same schemas: MaskBench schemas whose grammar the rewrite changes, sampled
evenly, each compiled cold (compiler cache cleared) alternating before/after, best of
``--repeat``. Along each schema's valid instances the two grammars' masks are compared
(they must be equal) and timed back to back. Then the same schemas in a row on one engine
each way, its compiler cache kept (as the runtime's upgrade compiles run): the total.

    PYTHONPATH=. python bench/bench_free_names.py --sample 60 --json out.json
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import random
import statistics
import time
from typing import Any

import numpy as np

from portable_guided.harness.maskbench import load_records, write_results
from portable_guided.runtime import GrammarSpec, load_tokenizer_info
from portable_guided.runtime.engines import xgrammar as xgrammar_engine
from portable_guided.runtime.engines.base import EmptyLanguage, UnsupportedSpec
from portable_guided.runtime.engines.xgrammar import XGrammarEngine
from portable_guided.runtime.engines.xgrammar_free_names import share_free_name_tails
from portable_guided.runtime.errors import GrammarSpecError

FILES = "../shared/data/maskbench/*.jsonl"


def _shared(on: bool) -> None:
    """The rewrite on, or off (xgrammar's own trie, as before)."""
    xgrammar_engine.share_free_name_tails = (  # type: ignore[assignment]
        share_free_name_tails if on else (lambda text: text))


def candidates(engine: XGrammarEngine, records: list[dict[str, Any]]) -> list[tuple[Any, ...]]:
    """(record, prepared input) of each schema whose xgrammar text the rewrite changes."""
    import xgrammar as xgr

    out = []
    for rec in records:
        try:
            prepared = engine.prepare(GrammarSpec.json_schema(rec["schema"]))
            text = str(xgr.Grammar.from_json_schema(prepared[0], any_whitespace=True,
                                                    strict_mode=False))
        except (UnsupportedSpec, EmptyLanguage, GrammarSpecError, RuntimeError):
            continue
        if share_free_name_tails(text) != text:
            out.append((rec, prepared))
    return out


def walk(engine: XGrammarEngine, compiled: Any, token_lists: list[list[int]]) -> tuple[
        list[np.ndarray], list[float]]:
    """Masks and back-to-back fill times (us) along each token list."""
    import xgrammar as xgr

    masks, times = [], []
    bitmask = xgr.allocate_token_bitmask(1, engine.vocab_size)
    for tokens in token_lists:
        matcher = xgr.GrammarMatcher(compiled)
        for token in tokens:
            t0 = time.perf_counter()
            matcher.fill_next_token_bitmask(bitmask)
            times.append((time.perf_counter() - t0) * 1e6)
            masks.append(bitmask.numpy().copy())
            if not matcher.accept_token(token):
                break
    return masks, times


def measure(engine: XGrammarEngine, info: Any, picked: list[tuple[Any, ...]],
            repeat: int) -> list[dict[str, Any]]:
    rows = []
    for rec, prepared in picked:
        tokens = [info.encode(json.dumps(t["data"])) for t in rec["tests"] if t["valid"]][:3]
        best = {"before": float("inf"), "after": float("inf")}
        compiled = {}
        try:
            for _ in range(repeat):
                for side in ("before", "after"):
                    _shared(side == "after")
                    engine._compiler.clear_cache()
                    t0 = time.perf_counter()
                    compiled[side] = engine.compile_prepared(prepared)
                    best[side] = min(best[side], time.perf_counter() - t0)
        except RuntimeError:  # xgrammar refuses some itself: not timed
            continue
        finally:
            _shared(True)
        masks_before, times_before = walk(engine, compiled["before"], tokens)
        masks_after, times_after = walk(engine, compiled["after"], tokens)
        same = len(masks_before) == len(masks_after) and all(
            np.array_equal(a, b) for a, b in zip(masks_before, masks_after))
        rows.append({"id": rec["id"], "before_ms": round(best["before"] * 1e3, 1),
                     "after_ms": round(best["after"] * 1e3, 1), "masks": len(masks_after),
                     "masks_equal": same, "mask_us_before": times_before,
                     "mask_us_after": times_after})
        print(f"{rec['id']:45s} {best['before'] * 1e3:8.0f} -> {best['after'] * 1e3:6.0f} ms"
              f"  masks {'equal' if same else 'DIFFER'}", flush=True)
    return rows


def in_a_row(info: Any, picked: list[tuple[Any, ...]]) -> dict[str, float]:
    """Total ms to compile every picked schema in a row on one fresh engine, each way."""
    totals = {}
    for side in ("before", "after", "before_again", "after_again"):
        _shared(side.startswith("after"))
        engine = XGrammarEngine.create(info)
        t0 = time.perf_counter()
        for _, prepared in picked:
            try:
                engine.compile_prepared(prepared)
            except RuntimeError:
                pass
        totals[side] = round((time.perf_counter() - t0) * 1e3, 1)
    _shared(True)
    return {"before_ms": min(totals["before"], totals["before_again"]),
            "after_ms": min(totals["after"], totals["after_again"])}


def _pct(values: list[float], q: float) -> float:
    return round(float(np.percentile(values, q)), 1)


def summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    ratios = [r["after_ms"] / r["before_ms"] for r in rows]
    before = [r["before_ms"] for r in rows]
    after = [r["after_ms"] for r in rows]
    mb = [t for r in rows for t in r["mask_us_before"]]
    ma = [t for r in rows for t in r["mask_us_after"]]
    return {"schemas": len(rows), "masks_equal": sum(r["masks_equal"] for r in rows),
            "ratio_p50": round(statistics.median(ratios), 3),
            "ratio_p90": round(float(np.percentile(ratios, 90)), 3),
            "ratio_max": round(max(ratios), 3),
            **{f"{side}_ms_p{q}": _pct(v, q) for side, v in (("before", before),
                                                             ("after", after))
               for q in (50, 90, 99)},
            **{f"mask_us_{side}_p{q}": _pct(v, q) for side, v in (("before", mb), ("after", ma))
               for q in (50, 99)}}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--files", default=FILES)
    p.add_argument("--sample", type=int, default=60, help="schemas timed")
    p.add_argument("--repeat", type=int, default=2)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", dest="out", default=None)
    args = p.parse_args()
    records = load_records(sorted(glob.glob(args.files)))
    if not records:
        p.error(f"no schemas found at {args.files!r}")
    info = load_tokenizer_info("deepseek")
    engine = XGrammarEngine.create(info)
    random.Random(args.seed).shuffle(records)
    picked = candidates(engine, records[:args.sample * 3])[:args.sample]
    rows = measure(engine, info, picked, args.repeat)
    result = summary(rows)
    result["in_a_row"] = in_a_row(info, picked)
    print(json.dumps(result, indent=1))
    if args.out:
        for r in rows:  # per-mask times summarised, not kept
            for side in ("before", "after"):
                times = r.pop(f"mask_us_{side}")
                r[f"mask_us_{side}_p50"] = _pct(times, 50) if times else None
        write_results(args.out, {"tokenizer": "deepseek", "summary": result, "rows": rows,
                                 "compile_threads": min(8, os.cpu_count() or 1)})  # create()'s
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
