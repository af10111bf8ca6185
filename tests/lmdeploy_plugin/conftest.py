"""The lmdeploy-cpu lane: lmdeploy 0.18.0's PyTorch engine's guided-decoding modules on the
CPU (no CUDA device: the few CUDA-only calls are stubbed where a test says so)."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import pytest

#: Mask and token identity with lmdeploy's own xgrammar matchers, and the slow-compile
#: limit, are asserted with our xgrammar engine; the backend's default engine (``auto``) has
#: its own test (test_lmdeploy_backend.py).
os.environ.setdefault("PORTABLE_GUIDED_LMDEPLOY_ENGINE", "xgrammar")

if importlib.util.find_spec("lmdeploy") is None:  # other lanes: nothing here can run
    collect_ignore_glob = ["test_*.py"]


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    here = Path(__file__).parent
    for item in items:
        if here in Path(str(item.fspath)).parents:
            item.add_marker(pytest.mark.lmdeploy)


@pytest.fixture(autouse=True, scope="session")
def _engine_modules_imported() -> None:
    """Import lmdeploy's logits processor first, as its engine's model agent does: the
    package's .pth hook registers the plugin then (tests that use ``GuidedDecodingManager``
    alone would otherwise see lmdeploy unpatched)."""
    import lmdeploy.pytorch.engine.logits_process  # noqa: F401
