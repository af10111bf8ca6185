"""``portable-guided bench maskbench ...``: the MaskBench harness of the grammar runtime."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Any

__all__ = ["register"]


def register(subparsers: Any) -> None:
    """Add the ``bench`` command with its ``maskbench`` subcommand."""
    bench = subparsers.add_parser("bench", help="benchmarks")
    sub = bench.add_subparsers(dest="bench_command", metavar="BENCH")
    mb = sub.add_parser(
        "maskbench",
        help="compile MaskBench schemas and walk their tests token by token",
        description="Compile each schema (under a time limit), then walk each test instance "
        "token by token, timing the mask before every token. Valid instances must be "
        "accepted to the end, invalid ones rejected.",
    )
    mb.add_argument("files", help="MaskBench JSONL file(s), comma-separated")
    mb.add_argument("--engine", default="auto",
                    help="runtime engine(s), comma-separated: auto, xgrammar, llguidance")
    mb.add_argument("--raw", default="",
                    help="also run raw libraries side by side, comma-separated: "
                    "xgrammar, llguidance")
    mb.add_argument("--tokenizer", default="deepseek",
                    help="deepseek, smollm2, qwen or a path (tokenizer.json, .gguf, .tiktoken)")
    mb.add_argument("--limit", type=int, default=None, help="first N schemas of each file")
    mb.add_argument("--timeout", type=float, default=30.0, help="compile time limit (s)")
    mb.add_argument("--json", dest="json_out", required=True, help="write results here")
    mb.add_argument("--quiet", action="store_true", help="no progress lines")
    mb.set_defaults(func=_run_maskbench)
    bench.set_defaults(func=lambda args: (bench.print_help(), 2)[1])


def _run_maskbench(args: argparse.Namespace) -> int:
    from portable_guided.harness.maskbench import (
        MODES,
        load_records,
        machine_note,
        run_mode,
        summary_table,
    )
    from portable_guided.runtime import load_tokenizer_info

    modes = [f"runtime:{e.strip()}" for e in args.engine.split(",") if e.strip()]
    modes += [f"raw:{e.strip()}" for e in args.raw.split(",") if e.strip()]
    from portable_guided.cli import UsageError

    bad = [m for m in modes if m not in MODES]
    if bad or not modes:
        raise UsageError(f"unknown engine(s) {bad}; known modes: {MODES}")
    if args.limit is not None and args.limit < 1:
        raise UsageError(f"--limit must be >= 1, got {args.limit}")
    if args.timeout <= 0:
        raise UsageError(f"--timeout must be > 0 seconds, got {args.timeout}")
    files = [f for f in args.files.split(",") if f]
    missing = [f for f in files if not os.path.isfile(f)]
    if missing or not files:
        raise UsageError(f"MaskBench file(s) not found: {missing or args.files!r}")
    records = load_records(files, args.limit)
    info = load_tokenizer_info(args.tokenizer)
    results: dict[str, Any] = {}
    for mode in modes:
        t0 = time.perf_counter()

        def progress(row: dict[str, Any], mode: str = mode) -> None:
            if not args.quiet:
                print(f"[{mode}] {row['id']}: {row['status']} {row['tests_ok']}/{row['tests']}",
                      file=sys.stderr)

        results[mode] = run_mode(mode, records, info, timeout_s=args.timeout, progress=progress)
        results[mode]["summary"]["wall_s"] = round(time.perf_counter() - t0, 2)
        # Written after every mode, so a long run that is cut short keeps what it finished.
        out = _result(results, modes[0], files, args, info.vocab_size, machine_note())
        with open(args.json_out, "w", encoding="utf-8") as fh:
            fh.write(_dumps(out))
    print(summary_table(out["modes"]))
    return 0


def _result(results: dict[str, Any], first: str, files: list[str], args: argparse.Namespace,
            vocab_size: int, machine: dict[str, Any]) -> dict[str, Any]:
    """The JSON document of the modes run so far (``summary``/``per_schema``: the first)."""
    primary = results[first]
    return {
        "summary": primary["summary"],
        "per_schema": primary["per_schema"],
        "mode": first,
        "modes": {m: r["summary"] for m, r in results.items()},
        "per_schema_by_mode": {m: r["per_schema"] for m, r in results.items() if m != first},
        "config": {"files": files, "limit": args.limit, "timeout_s": args.timeout,
                   "tokenizer": args.tokenizer, "vocab_size": vocab_size},
        "machine": machine,
    }


def _dumps(out: dict[str, Any]) -> str:
    """JSON with one line per schema row (readable diffs, a fraction of indent=1's size)."""

    def rows(values: list[dict[str, Any]]) -> str:
        return "[\n" + ",\n".join(
            json.dumps(r, ensure_ascii=False, separators=(",", ":")) for r in values) + "\n]"

    parts = []
    for key, val in out.items():
        if key == "per_schema":
            parts.append(f"{json.dumps(key)}: {rows(val)}")
        elif key == "per_schema_by_mode":
            inner = ",\n".join(f"{json.dumps(m)}: {rows(v)}" for m, v in val.items())
            parts.append(f"{json.dumps(key)}: {{\n{inner}\n}}")
        else:
            parts.append(f"{json.dumps(key)}: {json.dumps(val, indent=1)}")
    return "{\n" + ",\n".join(parts) + "\n}\n"
