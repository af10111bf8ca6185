"""Does an engine accept text that is not JSON? Each valid MaskBench instance is written with
something JSON forbids inside one of its strings (a raw tab, a raw quote, a backslash before
a letter that is no escape); an engine that accepts the text would let a model produce output
no JSON parser reads.

    PYTHONPATH=. python bench/json_control_probe.py --step 8 \
        --json bench/results/json_control_probe_s11.json

Per schema the engine compiles (our prepared form, as the runtime compiles it), the first
valid instance is tried with each break put into each of its first ``--strings`` strings.
"""

from __future__ import annotations

import argparse
import glob
import json
import time
from collections.abc import Iterator
from typing import Any

from portable_guided.harness.maskbench import load_records, write_results
from portable_guided.runtime import GrammarSpec, load_tokenizer_info

FILES = "../shared/data/maskbench/*.jsonl"
_MARK = "\u2063"  # stands for the break until the text is written
#: What is put into a string: a raw tab, a raw quote, a backslash before "q" (no escape).
BREAKS = {"tab": "\t", "quote": '"', "bad_escape": "\\q"}


def _string_paths(value: Any, path: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
    if isinstance(value, str):
        yield path
    elif isinstance(value, dict):
        for k, v in value.items():
            yield from _string_paths(v, (*path, k))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            yield from _string_paths(v, (*path, i))


def _broken(value: Any, path: tuple[Any, ...], brk: str) -> str:
    """``value`` as JSON text with ``brk`` written raw inside the string at ``path``."""
    if not path:
        marked = value + _MARK + "x"
    else:
        marked = json.loads(json.dumps(value))
        node = marked
        for part in path[:-1]:
            node = node[part]
        node[path[-1]] = node[path[-1]] + _MARK + "x"
    return json.dumps(marked, ensure_ascii=False).replace(_MARK, brk)


def _engines(info: Any, names: list[str]) -> dict[str, Any]:
    """Per engine: a function from a schema to a predicate on text (None: refused)."""
    out: dict[str, Any] = {}
    if "xgrammar" in names:
        import xgrammar as xgr

        from portable_guided.runtime.engines.xgrammar import XGrammarEngine

        xe = XGrammarEngine.create(info)

        def xgrammar(schema: Any) -> Any:
            compiled = xe.compile_prepared(xe.prepare(GrammarSpec.json_schema(schema)))

            def accepts(text: str) -> bool:
                m = xgr.GrammarMatcher(compiled, terminate_without_stop_token=True)
                return bool(m.accept_string(text) and m.is_terminated())
            return accepts
        out["xgrammar"] = xgrammar
    if "llguidance" in names:
        import llguidance as llg

        from portable_guided.runtime.engines import llguidance as llg_engine
        from portable_guided.runtime.engines.llguidance import LLGuidanceEngine

        le = LLGuidanceEngine.create(info)
        ltok = llg_engine.tokenizer(info)

        def llguidance(schema: Any) -> Any:
            grammar = le.compile(GrammarSpec.json_schema(schema))

            def accepts(text: str) -> bool:
                m = llg.LLMatcher(ltok, grammar, log_level=0)
                return bool(m.consume_tokens(ltok.tokenize_str(text)) and m.is_accepting())
            return accepts
        out["llguidance"] = llguidance
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--files", default=FILES)
    p.add_argument("--step", type=int, default=8, help="every n-th schema")
    p.add_argument("--strings", type=int, default=6, help="strings tried per instance")
    p.add_argument("--engines", default="xgrammar,llguidance")
    p.add_argument("--json", dest="out", default=None)
    args = p.parse_args()
    records = load_records(sorted(glob.glob(args.files)))[::args.step]
    info = load_tokenizer_info("deepseek")
    engines = _engines(info, args.engines.split(","))
    result: dict[str, Any] = {}
    for name, compile_ in engines.items():
        t0 = time.perf_counter()
        compiled = tried = 0
        accepted: list[dict[str, Any]] = []
        for rec in records:
            valid = [t["data"] for t in rec["tests"] if t["valid"]]
            if not valid:
                continue
            try:
                accepts = compile_(rec["schema"])
            except Exception:  # noqa: BLE001, S112 - refused: nothing to probe
                continue
            compiled += 1
            found = None
            for path in list(_string_paths(valid[0]))[: args.strings]:
                for kind, brk in BREAKS.items():
                    tried += 1
                    if accepts(_broken(valid[0], path, brk)):
                        found = {"id": rec["id"], "path": list(path), "break": kind}
                        break
                if found:
                    accepted.append(found)
                    break
        result[name] = {"schemas_compiled": compiled, "texts_tried": tried,
                        "schemas_accepting_non_json": len(accepted), "accepted": accepted,
                        "seconds": round(time.perf_counter() - t0, 1)}
        print(name, {k: v for k, v in result[name].items() if k != "accepted"}, flush=True)
    if args.out:
        write_results(args.out, {"tokenizer": "deepseek", "schemas": len(records),
                                 "engines": result})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
