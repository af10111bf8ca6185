"""The ``portable-guided`` command line.

Each subcommand lives in its own module under ``portable_guided.cli`` and exposes
``register(subparsers)``, which adds its parser and sets ``func(args) -> int``.
Modules are imported only to build the parser; they must not import heavy frameworks
at module level.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

__all__ = ["main", "build_parser"]

# Subcommand name -> module that implements it.
_COMMANDS = {
    "doctor": "portable_guided.cli.doctor",
    "precompile": "portable_guided.cli.precompile",
    "bench": "portable_guided.cli.bench",
    "generate": "portable_guided.cli.generate",
}


def build_parser() -> argparse.ArgumentParser:
    """Build the argument parser with every subcommand that is installed."""
    parser = argparse.ArgumentParser(
        prog="portable-guided",
        description="Portable grammar-constrained decoding: tools and self-checks.",
    )
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for module_name in _COMMANDS.values():
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as exc:
            if exc.name != module_name:
                raise
            continue  # a subcommand not built yet
        module.register(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the process exit status."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if getattr(args, "func", None) is None:
        parser.print_help()
        return 2
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
