"""What a length-bounded string costs on xgrammar in each form it can be written in: compile
time and the time of one mask while the string is being written, side by side in one run.

    PYTHONPATH=. python bench/bench_xgrammar_lengths.py \
        --json bench/results/xgrammar_lengths_cpu_s12.json

Forms (the schema is ``{"a": <string schema>}``, the text walked is 200 characters of prose
in ``a``, or as many as the bound allows):

- ``xgrammar``: the bounds as xgrammar compiles them itself (vLLM's backend): unsound, its
  rule for the characters lets raw control characters in;
- ``pattern``: the bounds as ``^[^\\x00-\\x1f"\\\\]{min,max}$`` (session 11's form for every
  bound): above 128 xgrammar builds the repeat as an automaton edge walked on every mask;
- ``ours``: what the runtime's xgrammar engine compiles now (``XGrammarEngine.compile``):
  the pattern up to 128, xgrammar's own rule with its class corrected above.

Each compile is timed once with the compiler cache cleared (a first compile of a schema,
which is what a request waits for); masks are the median over the walk's tokens.
"""

from __future__ import annotations

import argparse
import datetime
import json
import statistics
import sys
import time
from typing import Any

from portable_guided.harness.maskbench import machine_note
from portable_guided.runtime import GrammarSpec, load_tokenizer_info
from portable_guided.runtime.engines.xgrammar import XGrammarEngine

RAW_CHAR = '[^\\x00-\\x1f"\\\\]'
BOUNDS = [(0, 64), (0, 128), (0, 129), (0, 255), (0, 1000), (0, 4096), (0, 65535), (1, None),
          (200, None), (10, 300)]
PROSE = ("The quick brown fox jumps over the lazy dog near the river, while 42 birds sing. "
         * 4)[:200]


def _schema(string: dict[str, Any]) -> dict[str, Any]:
    return {"type": "object", "properties": {"a": string}, "required": ["a"],
            "additionalProperties": False}


def _forms(low: int, high: int | None) -> dict[str, dict[str, Any]]:
    native = {"type": "string", "minLength": low, **({} if high is None else {"maxLength": high})}
    count = f"{{{low}}}{RAW_CHAR}*" if high is None else f"{{{low},{high}}}"
    return {"xgrammar": native,
            "pattern": {"type": "string", "pattern": f"^{RAW_CHAR}{count}$"},
            "ours": native}


def _walk(xgr: Any, compiled: Any, info: Any, text: str) -> tuple[float, bool]:
    """Median mask time (us) over the tokens of ``text``, and whether all were accepted."""
    matcher = xgr.GrammarMatcher(compiled)
    bitmask = xgr.allocate_token_bitmask(1, info.vocab_size)
    times = []
    for token in info.encode(text):
        t0 = time.perf_counter()
        matcher.fill_next_token_bitmask(bitmask)
        times.append(time.perf_counter() - t0)
        if not matcher.accept_token(token):
            return statistics.median(times) * 1e6, False
    return statistics.median(times) * 1e6, True


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--tokenizer", default="deepseek")
    p.add_argument("--json", help="write the results here")
    args = p.parse_args()

    import xgrammar as xgr

    info = load_tokenizer_info(args.tokenizer)
    engine = XGrammarEngine.create(info)
    plain = xgr.GrammarCompiler(engine.tokenizer_info, max_threads=1, cache_enabled=False)
    rows = []
    for low, high in BOUNDS:
        text = json.dumps({"a": PROSE[:high]})  # (as much as the bound lets in)
        for form, string in _forms(low, high).items():
            schema = json.dumps(_schema(string))
            t0 = time.perf_counter()
            if form == "ours":
                engine.forget(None)  # (clears the compiler's cache)
                compiled = engine.compile(GrammarSpec.json_schema(schema))
            else:
                compiled = plain.compile_json_schema(schema, any_whitespace=True,
                                                     strict_mode=False)
            compile_ms = (time.perf_counter() - t0) * 1e3
            mask_us, accepted = _walk(xgr, compiled, info, text)
            row = {"min": low, "max": high, "form": form, "compile_ms": round(compile_ms, 1),
                   "mask_us_p50": round(mask_us, 1), "walk_accepted": accepted}
            rows.append(row)
            print(json.dumps(row), flush=True)
    out = {"command": " ".join(["python", *sys.argv]), "tokenizer": args.tokenizer,
           "date": datetime.date.today().isoformat(), "machine": machine_note(),
           "xgrammar": XGrammarEngine.version(), "text_chars": len(PROSE), "rows": rows}
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
