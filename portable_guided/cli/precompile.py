"""``portable-guided precompile``: compile every bucket's apply graph ahead of time.

Example::

    portable-guided precompile --platform xla --max-batch 256 --vocab 151936 \\
        --dtype bfloat16 --cache-dir /var/cache/portable-guided
"""

from __future__ import annotations

import argparse
import json
import sys

__all__ = ["register", "run"]


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the ``precompile`` subcommand."""
    parser = subparsers.add_parser(
        "precompile",
        help="compile the static-shape apply graph of every batch bucket ahead of time",
        description=(
            "Compile the apply graph of every batch bucket (powers of two from --min-bucket, "
            "capped at --max-batch) and store it in a persistent compilation cache. Prints "
            "graphs compiled and seconds per bucket."
        ),
    )
    parser.add_argument("--platform", default="xla",
                        help="static-shape platform: xla, jax, xpu, npu or static (default: xla)")
    parser.add_argument("--max-batch", type=int, required=True, help="largest batch the engine runs")
    parser.add_argument("--min-bucket", type=int, default=8, help="smallest bucket (default: 8)")
    parser.add_argument("--vocab", type=int, required=True,
                        help="logits width in columns (the model's padded vocabulary)")
    parser.add_argument("--dtype", default="bfloat16", choices=("float32", "bfloat16", "float16"),
                        help="logits dtype (default: bfloat16)")
    parser.add_argument("--cache-dir", default=None,
                        help="persistent compilation cache directory (xla, jax); created if missing")
    parser.add_argument("--device", default=None, help="device string (default: the platform's)")
    parser.add_argument("--json", action="store_true",
                        help="print the report as JSON on stdout instead of a table")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Run the subcommand; returns the exit status."""
    from ..precompile import precompile

    try:
        report = precompile(
            platform=args.platform,
            max_batch=args.max_batch,
            min_bucket=args.min_bucket,
            vocab=args.vocab,
            dtype=args.dtype,
            cache_dir=args.cache_dir,
            device=args.device,
            progress=not args.no_progress,
        )
    except (ValueError, TypeError, ImportError, RuntimeError) as exc:
        print(f"portable-guided precompile: error: {exc}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(report.to_dict(), indent=2))
    else:
        print(report.format_table())
    return 0
