"""Settings the serving-engine plugins read from the environment."""

from __future__ import annotations

import os

__all__ = ["env_seconds"]


def env_seconds(name: str, default: float | None) -> float | None:
    """Seconds from environment variable ``name`` (``default`` when unset or empty); zero or
    less means no limit (None). A value that is not a number raises ``ValueError``."""
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = float(raw)
    except ValueError:
        raise ValueError(f"{name} must be a number of seconds, got {raw!r}") from None
    return value if value > 0 else None
