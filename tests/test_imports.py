"""``import portable_guided`` must not pull in a tensor framework or a grammar engine."""

import subprocess
import sys

HEAVY = ("torch", "paddle", "xgrammar", "torch_xla", "llguidance", "transformers", "triton")


def test_import_is_light():
    code = (
        "import sys, portable_guided, portable_guided.cli\n"
        "portable_guided.cli.build_parser()\n"
        f"print(' '.join(m for m in {HEAVY!r} if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""


def test_public_names_have_docstrings():
    import portable_guided as pg

    missing = [n for n in pg.__all__ if not n.startswith("__") and not getattr(pg, n).__doc__]
    assert missing == []
