"""Style and type checks of the package (the lint lane; skipped where the tools are missing).

ruff runs with the pinned version's default rules (pyproject ``[tool.ruff.lint]``); mypy with
the strictness documented in pyproject ``[tool.mypy]``. Both must report nothing.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.lint

REPO_ROOT = Path(__file__).resolve().parent.parent


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", *args], cwd=REPO_ROOT, capture_output=True,
                          text=True, timeout=600, check=False)


def test_ruff_finds_nothing() -> None:
    pytest.importorskip("ruff", reason="ruff is installed in the lint lane")
    done = _run("ruff", "check", "--no-cache", ".")
    assert done.returncode == 0, done.stdout + done.stderr


def test_mypy_finds_no_error_in_the_package() -> None:
    pytest.importorskip("mypy", reason="mypy is installed in the lint lane")
    done = _run("mypy", "--no-incremental")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "Success: no issues found" in done.stdout
