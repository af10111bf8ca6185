"""The sglang-cpu lane: SGLang 0.5.23's grammar modules imported on the CPU (no engine)."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import pytest

#: Mask identity with SGLang's own xgrammar backend is asserted with our xgrammar engine;
#: the backend's default engine (``auto``) has its own test (test_sglang_backend.py).
os.environ.setdefault("PORTABLE_GUIDED_SGLANG_ENGINE", "xgrammar")

if importlib.util.find_spec("sglang") is None:  # other lanes: nothing here can run
    collect_ignore_glob = ["test_*.py"]


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    here = Path(__file__).parent
    for item in items:
        if here in Path(str(item.fspath)).parents:
            item.add_marker(pytest.mark.sglang)
