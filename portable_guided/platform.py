"""The :class:`Platform` description that built-in and out-of-tree platforms provide."""

from __future__ import annotations

import functools
import importlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

__all__ = ["Platform", "Kernel", "HOOKS"]

Kernel = Callable[[Any, Any, Any], Any]
"""``kernel(logits, bitmask, plan) -> masked logits`` (see ``portable_guided.kernels``)."""

HOOKS: Mapping[str, str] = {
    "probe": "probe(framework) -> None when logits of that framework can live on the "
             "platform's device here, else the reason why not; never raises for a missing "
             "framework",
    "to_device": "to_device(array, framework) -> the NumPy array as a tensor of that framework "
                 "on the platform's device",
    "synchronize": "synchronize(tensor): wait for the work queued on the tensor's device "
                   "(default: nothing to wait for)",
    "flush": "flush(tensor): start the work a lazy device has recorded (an XLA graph) without "
             "waiting for it (default: nothing recorded)",
    "precompile": "precompile(cache_dir) -> the runtime portable_guided.precompile uses to "
                  "count and cache compiled graphs, and optionally to warm a bucket "
                  "(default: an eager device, nothing counted)",
}
"""The optional hooks a :class:`Platform` may name in ``hooks``, with their signatures."""

_DEFAULT_HINTS = {
    "torch": "pip install 'portable-guided[torch]' (pin torch, e.g. torch==2.13.0)",
    "paddle": "pip install 'portable-guided[paddle]'",
    "numpy": "pip install numpy",
    "jax": "pip install 'portable-guided[jax]'",
}


@dataclass(frozen=True, eq=False)  # identity hash: kernels is a dict
class Platform:
    """How one device family applies token masks.

    Attributes:
        name: registry name (``cuda``, ``xla``, ...).
        description: one line for ``portable-guided doctor`` and error messages.
        device_types: device families whose logits this platform serves by default.
        kernels: framework name -> ``"module:function"`` of the kernel; modules are imported
            only when the kernel is first used.
        strategy: short name of the approach (``in-place kernel``, ``static shapes``, ...).
        static_shapes: the kernels compile one graph per logits shape and can also run on
            CPU tensors (so CI exercises them when forced with ``platform=``).
        in_place: the kernels write into the caller's logits and return the same object.
        install_hints: framework -> how to install what the kernel needs.
        hooks: hook name (see :data:`HOOKS`) -> ``"module:function"``; like kernels, imported
            only when first used, so platform modules stay free of framework imports. They
            let tools (``doctor``, ``precompile``, the device tests) handle every platform's
            device without knowing its name.

    Example (an out-of-tree platform, registered through the entry-point group
    ``portable_guided.platforms``)::

        PLATFORM = Platform(
            name="hpu", description="Intel Gaudi", device_types=("hpu",),
            kernels={"torch": "portable_guided.kernels.static_torch:apply_static_torch"},
            strategy="static shapes", static_shapes=True,
            hooks={"probe": "my_pkg.platform:probe", "to_device": "my_pkg.platform:to_device"},
        )
    """

    name: str
    description: str
    device_types: tuple[str, ...]
    kernels: Mapping[str, str]
    strategy: str
    static_shapes: bool = False
    in_place: bool = True
    install_hints: Mapping[str, str] = field(default_factory=dict)
    hooks: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        unknown = sorted(set(self.hooks) - set(HOOKS))
        if unknown:
            raise ValueError(
                f"platform {self.name!r}: unknown hook(s) {unknown}; known: {', '.join(HOOKS)}"
            )
        for where, targets in (("kernels", self.kernels), ("hooks", self.hooks)):
            bad = {k: v for k, v in targets.items() if not isinstance(v, str) or ":" not in v}
            if bad:
                raise ValueError(
                    f"platform {self.name!r}: {where} must map to 'module:function' strings, "
                    f"got {bad!r}"
                )

    def can_serve(self, device_type: str) -> bool:
        """Whether logits on ``device_type`` can go through this platform's kernels."""
        return device_type in self.device_types or self.static_shapes

    def kernel_for(self, framework: str) -> Kernel:
        """Import and return the kernel for ``framework`` logits.

        Raises ``ValueError`` if the platform has none for that framework and ``ImportError``
        with an install hint if the framework (or a library the kernel needs) is missing.
        """
        target = self.kernels.get(framework)
        if target is None:
            raise ValueError(
                f"platform {self.name!r} has no kernel for {framework} logits; "
                f"it serves: {', '.join(sorted(self.kernels)) or 'nothing'}"
            )
        try:
            kernel: Kernel = _load(target)
        except ImportError as exc:
            hint = self.install_hints.get(framework) or _DEFAULT_HINTS.get(framework, "")
            raise ImportError(
                f"platform {self.name!r} needs {exc.name or 'a missing module'} for {framework} "
                f"logits ({exc}); install it: {hint}"
            ) from exc
        return kernel

    def hook(self, name: str) -> Callable[..., Any] | None:
        """The hook called ``name`` (imported on first use), or ``None`` if the platform has
        none; ``name`` must be one of :data:`HOOKS`."""
        if name not in HOOKS:
            raise ValueError(f"unknown hook {name!r}; known: {', '.join(HOOKS)}")
        target = self.hooks.get(name)
        return None if target is None else _load(target)

    def probe(self, framework: str) -> str | None:
        """``None`` when ``framework`` logits can be put on this platform's device on this
        machine, else the reason why not (the framework or the device is missing).

        >>> import portable_guided as pg
        >>> pg.get_platform("cpu").probe("numpy") is None
        True
        """
        if framework not in self.kernels:
            return f"platform {self.name!r} has no kernel for {framework} logits"
        probe = self.hook("probe")
        if probe is None:
            return f"platform {self.name!r} has no probe hook"
        reason: str | None = probe(framework)
        return reason

    def to_device(self, array: Any, framework: str) -> Any:
        """``array`` (NumPy) as a ``framework`` tensor on this platform's device; check
        :meth:`probe` first."""
        if framework not in self.kernels:
            raise ValueError(
                f"platform {self.name!r} has no kernel for {framework} logits; "
                f"it serves: {', '.join(sorted(self.kernels)) or 'nothing'}"
            )
        to_device = self.hook("to_device")
        if to_device is None:
            raise ValueError(f"platform {self.name!r} has no to_device hook")
        return to_device(array, framework)

    def synchronize(self, tensor: Any) -> None:
        """Wait until the work queued on ``tensor``'s device is done (for timings)."""
        synchronize = self.hook("synchronize")
        if synchronize is not None:
            synchronize(tensor)

    def flush(self, tensor: Any) -> None:
        """Start the work a lazy device recorded for ``tensor`` (an XLA graph), not waiting."""
        flush = self.hook("flush")
        if flush is not None:
            flush(tensor)


@functools.cache
def _load(target: str) -> Any:
    """The object a ``"module:attribute"`` string names (a failed import is not cached)."""
    module_name, _, attribute = target.partition(":")
    return getattr(importlib.import_module(module_name), attribute)
