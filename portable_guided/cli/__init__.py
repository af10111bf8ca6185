"""The ``portable-guided`` command line.

Each subcommand lives in its own module under ``portable_guided.cli`` and exposes
``register(subparsers)``, which adds its parser and sets ``func(args) -> int``.
Modules are imported only to build the parser; they must not import heavy frameworks
at module level.

Exit status: what the subcommand returns (0 success, 1 a check failed); 2 for a user error
(bad option, missing file or package, invalid grammar), printed as one line without a
traceback (``--log-level debug`` adds the traceback).
"""

from __future__ import annotations

import argparse
import importlib
import logging
import sys
from collections.abc import Sequence

__all__ = ["UsageError", "build_parser", "main"]

log = logging.getLogger("portable_guided.cli")

# Subcommand name -> module that implements it.
_COMMANDS = {
    "doctor": "portable_guided.cli.doctor",
    "precompile": "portable_guided.cli.precompile",
    "bench": "portable_guided.cli.bench",
    "generate": "portable_guided.cli.generate",
}

_LEVELS = ("debug", "info", "warning", "error")


class UsageError(Exception):
    """A user error in a subcommand: printed as one line, exit status 2."""


def build_parser() -> argparse.ArgumentParser:
    """Build the argument parser with every subcommand that is installed."""
    from portable_guided import __version__

    parser = argparse.ArgumentParser(
        prog="portable-guided",
        description="Portable grammar-constrained decoding: tools and self-checks.",
    )
    parser.add_argument("--version", action="version", version=f"portable-guided {__version__}")
    parser.add_argument("-v", "--verbose", action="count", default=0,
                        help="more log lines: -v info (compile fallbacks, rejected tokens), "
                        "-vv debug")
    parser.add_argument("--log-level", choices=_LEVELS, default=None,
                        help="log level (default: warning, which shows compile time-outs)")
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


def log_level(args: argparse.Namespace) -> int:
    """The logging level chosen by ``--log-level`` or ``-v``/``-vv`` (given both, the more
    verbose wins); warning by default."""
    chosen = [] if args.log_level is None else [getattr(logging, args.log_level.upper())]
    if args.verbose or not chosen:
        chosen.append({0: logging.WARNING, 1: logging.INFO}.get(args.verbose, logging.DEBUG))
    return min(chosen)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the process exit status."""
    parser = build_parser()
    args = parser.parse_args(argv)
    level = log_level(args)
    logging.basicConfig(level=level, stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("portable_guided").setLevel(level)
    if getattr(args, "func", None) is None:
        parser.print_help()
        return 2
    try:
        return int(args.func(args) or 0)
    except KeyboardInterrupt:
        print("portable-guided: interrupted", file=sys.stderr)
        return 130
    except (UsageError, OSError, ValueError, ImportError) as exc:
        # User errors (bad input, missing file or package): one line, no traceback.
        log.debug("traceback of the error below", exc_info=True)
        message = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        if isinstance(exc, OSError) and exc.filename is not None and exc.strerror:
            message = f"{exc.strerror}: {exc.filename}"
        print(f"portable-guided {args.command}: error: {message}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
