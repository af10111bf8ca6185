"""The :class:`Platform` description that built-in and out-of-tree platforms provide."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

__all__ = ["Platform", "Kernel"]

Kernel = Callable[[Any, Any, Any], Any]
"""``kernel(logits, bitmask, plan) -> masked logits`` (see ``portable_guided.kernels``)."""

_DEFAULT_HINTS = {
    "torch": "pip install 'portable-guided[torch]' (pin torch, e.g. torch==2.13.0)",
    "paddle": "pip install 'portable-guided[paddle]'",
    "numpy": "pip install numpy",
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

    Example (an out-of-tree platform, registered through the entry-point group
    ``portable_guided.platforms``)::

        PLATFORM = Platform(
            name="hpu", description="Intel Gaudi", device_types=("hpu",),
            kernels={"torch": "portable_guided.kernels.static_torch:apply_static_torch"},
            strategy="static shapes", static_shapes=True,
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
        module_name, _, attribute = target.partition(":")
        try:
            module = importlib.import_module(module_name)
        except ImportError as exc:
            hint = self.install_hints.get(framework) or _DEFAULT_HINTS.get(framework, "")
            raise ImportError(
                f"platform {self.name!r} needs {exc.name or 'a missing module'} for {framework} "
                f"logits ({exc}); install it: {hint}"
            ) from exc
        return getattr(module, attribute)
