"""A pytest plugin for running SGLang's own unit tests with our SGLang plugin loaded
(``-p upstream_loader``), as SGLang's processes load it: ``load_plugins()`` with
``SGLANG_PLUGINS=portable_guided``. The report header says which hooks took over."""

from __future__ import annotations

import os

import pytest


def pytest_configure(config: pytest.Config) -> None:
    if os.environ.get("SGLANG_PLUGINS") == "portable_guided":
        from sglang.srt import plugins

        plugins.load_plugins()


def pytest_report_header(config: pytest.Config) -> str:
    if os.environ.get("SGLANG_PLUGINS") != "portable_guided":
        return "portable_guided SGLang plugin: not loaded"
    from portable_guided.integrations import sglang as plugin

    return (f"portable_guided SGLang plugin: taken over {sorted(plugin.taken_over())}, "
            f"patched {plugin.is_patched()}")
