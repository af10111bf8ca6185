"""The platform registry: which :class:`Platform` serves which logits.

The registry is data: a platform name maps to the dotted path of its :class:`Platform`, and a
platform module is imported only when needed. Selection happens per call from the logits'
framework and device and is cached. ``platform=`` or the environment variable
``PORTABLE_GUIDED_PLATFORM`` force a platform; out-of-tree platforms come in through the
entry-point group ``portable_guided.platforms``.
"""

from __future__ import annotations

import importlib
import os
import threading
import warnings
from collections.abc import Mapping
from dataclasses import dataclass
from importlib.metadata import entry_points
from typing import Any

from ._frameworks import device_type_of, framework_of
from .platform import Kernel, Platform

__all__ = [
    "ENV_VAR",
    "ENTRY_POINT_GROUP",
    "PlatformRegistry",
    "Resolution",
    "REGISTRY",
    "available_platforms",
    "get_platform",
    "register_platform",
    "resolve",
]

ENV_VAR = "PORTABLE_GUIDED_PLATFORM"
ENTRY_POINT_GROUP = "portable_guided.platforms"
FALLBACK_PLATFORM = "static"

BUILTIN_PLATFORMS: Mapping[str, str] = {
    name: f"portable_guided.platforms.{name}:PLATFORM"
    for name in ("cpu", "cuda", "xla", "jax", "xpu", "npu", "static")
}


@dataclass(frozen=True)
class Resolution:
    """What serves a given kind of logits: the platform and its kernel."""

    platform: Platform
    framework: str
    device_type: str
    kernel: Kernel
    forced_by: str | None
    """``"argument"``, ``"environment"`` or ``None`` when chosen from the device."""

    @property
    def strategy(self) -> str:
        """The approach the platform takes (``vectorized in place``, ``static shapes``...)."""
        return self.platform.strategy

    @property
    def kernel_name(self) -> str:
        """Dotted name of the kernel function."""
        return f"{self.kernel.__module__}.{self.kernel.__qualname__}"

    def __str__(self) -> str:
        return (
            f"{self.framework} logits on {self.device_type} -> platform {self.platform.name!r} "
            f"({self.strategy}, {self.kernel_name})"
        )


def _load_object(target: str) -> Any:
    module_name, _, attribute = target.partition(":")
    return getattr(importlib.import_module(module_name), attribute)


class PlatformRegistry:
    """Platforms by name, with the device types each one claims."""

    def __init__(
        self,
        builtins: Mapping[str, str] = BUILTIN_PLATFORMS,
        entry_point_group: str | None = ENTRY_POINT_GROUP,
    ) -> None:
        self._sources: dict[str, str | Platform] = dict(builtins)
        self._loaded: dict[str, Platform] = {}
        self._entry_point_group = entry_point_group
        self._plugins_loaded = entry_point_group is None
        self._owners: dict[str, str] | None = None
        self._cache: dict[tuple[str, str, Any], Resolution] = {}
        self._lock = threading.RLock()

    def register(
        self, platform: Platform | str, *, name: str | None = None, override: bool = False
    ) -> None:
        """Add a platform (a :class:`Platform` or the ``"module:attr"`` path of one).

        Refuses to replace an existing name, or to claim a device type another platform
        claims, unless ``override=True``.
        """
        if isinstance(platform, Platform):
            name = name or platform.name
        elif not isinstance(platform, str) or ":" not in platform:
            raise TypeError(
                f"register a Platform or a 'module:attribute' string, got {platform!r}"
            )
        elif name is None:
            raise ValueError(f"a name is needed to register {platform!r}")
        with self._lock:
            self._load_plugins()
            if name in self._sources and not override:
                raise ValueError(
                    f"platform {name!r} is already registered; pass override=True to replace it"
                )
            previous = self._sources.get(name)
            self._sources[name] = platform
            self._loaded.pop(name, None)
            self._invalidate()
            if isinstance(platform, Platform) and not override:
                try:
                    self._device_owners()
                except ValueError:
                    self._restore(name, previous)
                    raise

    def _restore(self, name: str, previous: str | Platform | None) -> None:
        if previous is None:
            del self._sources[name]
        else:
            self._sources[name] = previous
        self._loaded.pop(name, None)
        self._invalidate()

    def _invalidate(self) -> None:
        self._owners = None
        self._cache.clear()

    def names(self) -> list[str]:
        """Names of every registered platform (built-in and plugins), sorted."""
        with self._lock:
            self._load_plugins()
            return sorted(self._sources)

    def get(self, name: str) -> Platform:
        """The platform called ``name``; an unknown name lists the available ones."""
        with self._lock:
            self._load_plugins()
            if name not in self._sources:
                raise ValueError(
                    f"unknown platform {name!r}; available: {', '.join(sorted(self._sources))}"
                )
            if name not in self._loaded:
                source = self._sources[name]
                platform = _load_object(source) if isinstance(source, str) else source
                if callable(platform) and not isinstance(platform, Platform):
                    platform = platform()
                if not isinstance(platform, Platform):
                    raise TypeError(f"platform {name!r} resolved to {platform!r}, not a Platform")
                self._loaded[name] = platform
            return self._loaded[name]

    def resolve(self, logits: Any, platform: str | Platform | None = None) -> Resolution:
        """Choose the platform and kernel for ``logits``.

        Order: the ``platform`` argument, then ``$PORTABLE_GUIDED_PLATFORM``, then the
        platform that claims the logits' device type (``static`` for unclaimed devices).
        """
        framework = framework_of(logits)
        device_type = device_type_of(logits, framework)
        forced_by = None
        if platform is not None:
            forced_by = "argument"
        elif os.environ.get(ENV_VAR):
            platform, forced_by = os.environ[ENV_VAR], "environment"
        key = (framework, device_type, platform)
        cached = self._cache.get(key)
        if cached is not None:
            return cached
        with self._lock:
            if isinstance(platform, Platform):
                chosen = platform
            elif platform is not None:
                chosen = self._get_forced(platform, forced_by)
            else:
                chosen = self.for_device(device_type)
            if not chosen.can_serve(device_type):
                raise ValueError(
                    f"platform {chosen.name!r} cannot serve logits on {device_type}; it serves "
                    f"{', '.join(chosen.device_types)}"
                )
            resolution = Resolution(
                chosen, framework, device_type, chosen.kernel_for(framework), forced_by
            )
            self._cache[key] = resolution
            return resolution

    def for_device(self, device_type: str) -> Platform:
        """The platform that claims ``device_type`` (``static`` for unclaimed devices),
        ignoring ``platform=`` and ``$PORTABLE_GUIDED_PLATFORM``.

        >>> import portable_guided as pg
        >>> pg.registry.REGISTRY.for_device("cuda").name
        'cuda'
        """
        with self._lock:
            return self.get(self._device_owners().get(device_type, FALLBACK_PLATFORM))

    def _get_forced(self, name: str, forced_by: str | None) -> Platform:
        if not isinstance(name, str):
            raise TypeError(f"platform must be a name or a Platform, got {type(name).__name__}")
        try:
            return self.get(name)
        except ValueError as exc:
            if forced_by == "environment":
                raise ValueError(f"{ENV_VAR}={name!r}: {exc}") from None
            raise

    def _device_owners(self) -> dict[str, str]:
        if self._owners is None:
            owners: dict[str, str] = {}
            for name in sorted(self._sources):
                for device_type in self.get(name).device_types:
                    if device_type in owners:
                        raise ValueError(
                            f"platforms {owners[device_type]!r} and {name!r} both claim device "
                            f"type {device_type!r}; force one with platform= or ${ENV_VAR}"
                        )
                    owners[device_type] = name
            self._owners = owners
        return self._owners

    def _load_plugins(self) -> None:
        if self._plugins_loaded:
            return
        self._plugins_loaded = True
        if self._entry_point_group is None:  # plugins disabled for this registry
            return
        for entry in entry_points(group=self._entry_point_group):
            if entry.name in self._sources:
                warnings.warn(
                    f"entry point {entry.value!r} tries to replace platform {entry.name!r}; "
                    "ignored (register it under another name)",
                    stacklevel=3,
                )
                continue
            self._sources[entry.name] = entry.value


REGISTRY = PlatformRegistry()
"""The process-wide registry used by :func:`portable_guided.apply_token_mask`."""


def resolve(logits: Any, platform: str | Platform | None = None) -> Resolution:
    """Which platform and kernel :func:`apply_token_mask` uses for ``logits``.

    >>> import numpy as np, portable_guided as pg
    >>> pg.resolve(np.zeros(8, np.float32)).platform.name
    'cpu'
    """
    return REGISTRY.resolve(logits, platform)


def register_platform(
    platform: Platform | str, *, name: str | None = None, override: bool = False
) -> None:
    """Register a platform in the process-wide registry (see :meth:`PlatformRegistry.register`)."""
    REGISTRY.register(platform, name=name, override=override)


def available_platforms() -> list[str]:
    """Names of all registered platforms."""
    return REGISTRY.names()


def get_platform(name: str) -> Platform:
    """The registered platform called ``name``."""
    return REGISTRY.get(name)
