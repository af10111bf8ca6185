"""Test-suite wide configuration: one marker per registered platform.

Device tests (``tests/test_devices.py``) are marked with their platform's name, and CI lanes
select them with ``-m <name>``; registering the markers from the registry means a new built-in
platform needs no marker list edited by hand.
"""

from __future__ import annotations

import pytest

from portable_guided.registry import BUILTIN_PLATFORMS, get_platform


def pytest_configure(config: pytest.Config) -> None:
    for name in BUILTIN_PLATFORMS:
        config.addinivalue_line(
            "markers", f"{name}: runs on the {name} platform ({get_platform(name).description})"
        )
