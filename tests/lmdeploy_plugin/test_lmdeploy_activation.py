"""Activation in every process lmdeploy starts: the package's .pth hook, in spawned
processes (as lmdeploy's api_server starts its engine), off with PORTABLE_GUIDED_LMDEPLOY=0."""

from __future__ import annotations

import multiprocessing
import os
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest


def _engine_process(queue: multiprocessing.Queue) -> None:  # type: ignore[type-arg]
    """In a spawned process: import lmdeploy's model agent (the engine's own import chain)
    and report what is patched."""
    seen_before = "portable_guided" in sys.modules
    from lmdeploy.pytorch.engine.guided_process import GuidedDecodingManager
    from lmdeploy.pytorch.engine.model_agent.agent import BaseModelAgent  # noqa: F401

    raw = GuidedDecodingManager.__dict__["apply_batched_bitmap"]
    queue.put({"portable_guided_before_lmdeploy": seen_before,
               "patched": getattr(raw, "__wrapped__", None) is not None,
               "portable_guided_imported": "portable_guided" in sys.modules,
               "hook_imported": "portable_guided_lmdeploy_hook" in sys.modules})


def _spawn(monkeypatch: pytest.MonkeyPatch, setting: str) -> dict[str, bool]:
    monkeypatch.setenv("PORTABLE_GUIDED_LMDEPLOY", setting)
    context = multiprocessing.get_context("spawn")
    queue = context.Queue()
    process = context.Process(target=_engine_process, args=(queue,))
    process.start()
    try:
        result = queue.get(timeout=120)
    finally:
        process.join(60)
    assert process.exitcode == 0, process.exitcode
    return result


def test_the_pth_file_is_installed() -> None:
    pth = Path(sysconfig.get_paths()["purelib"]) / "portable_guided_lmdeploy.pth"
    assert pth.read_text().strip() == "import portable_guided_lmdeploy_hook"


def test_spawned_engine_process_is_patched(monkeypatch: pytest.MonkeyPatch) -> None:
    result = _spawn(monkeypatch, "1")
    assert result == {"portable_guided_before_lmdeploy": False, "patched": True,
                      "portable_guided_imported": True, "hook_imported": True}


def test_spawned_process_left_alone_when_off(monkeypatch: pytest.MonkeyPatch) -> None:
    result = _spawn(monkeypatch, "0")
    assert result == {"portable_guided_before_lmdeploy": False, "patched": False,
                      "portable_guided_imported": False, "hook_imported": True}


def test_a_process_without_lmdeploy_imports_nothing_of_ours() -> None:
    """The hook runs in every interpreter of the environment: it must stay a few stdlib
    lines there (no portable_guided, no torch)."""
    code = ("import sys; print(sorted(m for m in sys.modules if m.startswith(('portable_guided'"
            ", 'torch', 'numpy'))))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, env={**os.environ, "PORTABLE_GUIDED_LMDEPLOY": "1"},
                         cwd="/")
    assert out.stdout.strip() == "['portable_guided_lmdeploy_hook']"


def test_register_before_lmdeploys_engine_is_imported() -> None:
    """Calling register() first (a script that activates the plugin itself) imports the
    trigger module, whose .pth hook registers too: no deadlock, one takeover."""
    code = ("import lmdeploy\nfrom portable_guided.integrations import lmdeploy as p\n"
            "p.register()\nfrom lmdeploy.pytorch.engine.guided_process import "
            "GuidedDecodingManager as G\nraw = G.__dict__['apply_batched_bitmap']\n"
            "print(p.taken_over(), hasattr(raw.__wrapped__, '__wrapped__'))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, timeout=120, cwd="/")
    assert out.stdout.strip().splitlines()[-1] == "{'apply': 'verified'} False"
