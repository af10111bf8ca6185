"""XLA (TPU, and torch_xla on any PJRT device): static shapes, one graph per logits shape.

XLA is lazy: Torch ops on an XLA tensor record a graph, which compiles and runs at
``torch_xla.sync()`` (the ``flush`` hook). ``precompile`` counts the compilations and keeps them
in a persistent cache through :class:`XlaPrecompile`.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

from ..platform import Platform
from ._devices import missing

if TYPE_CHECKING:
    import torch

    from ..precompile import CompileStats

PLATFORM = Platform(
    name="xla",
    description="torch_xla / TPU: host-built bitmask, one transfer, precompiled graphs",
    device_types=("xla",),
    kernels={"torch": "portable_guided.kernels.static_torch:apply_static_torch"},
    strategy="static shapes",
    static_shapes=True,
    install_hints={"torch": "pip install 'portable-guided[xla]' (torch_xla matching torch)"},
    hooks={
        "probe": "portable_guided.platforms.xla:probe",
        "to_device": "portable_guided.platforms.xla:to_device",
        "synchronize": "portable_guided.platforms.xla:synchronize",
        "flush": "portable_guided.platforms.xla:flush",
        "precompile": "portable_guided.platforms.xla:XlaPrecompile",
    },
)


def probe(framework: str) -> str | None:
    """torch_xla installed (it runs on the CPU PJRT client when no TPU is there)."""
    return missing(framework) or missing("torch_xla")


def to_device(array: Any, framework: str) -> Any:
    """``array`` on the default XLA device."""
    import torch
    import torch_xla

    return torch.from_numpy(array).to(torch_xla.device())


def flush(tensor: Any) -> None:
    """Compile (or fetch) and launch the recorded graph, without waiting for it."""
    import torch_xla

    torch_xla.sync()


def synchronize(tensor: Any) -> None:
    """Launch the recorded graph and wait until the device is idle."""
    import torch_xla.core.xla_model as xm

    flush(tensor)
    xm.wait_device_ops()


class XlaPrecompile:
    """torch_xla for ``precompile``: persistent cache, device, compile counters, sync."""

    def __init__(self, cache_dir: str | None) -> None:
        import torch_xla
        import torch_xla.runtime as xr

        if cache_dir is not None:
            if torch_xla._XLAC._xla_computation_cache_is_initialized():
                active = os.environ.get("XLA_PERSISTENT_CACHE_PATH")
                if active != cache_dir:
                    raise RuntimeError(
                        f"cannot use cache_dir={cache_dir!r}: this process already ran XLA "
                        f"computations (persistent cache: {active!r}); call precompile() before "
                        "any other XLA work, or run it in its own process"
                    )
            else:
                os.makedirs(cache_dir, exist_ok=True)
                xr.initialize_cache(cache_dir, readonly=False)
        self._torch_xla = torch_xla

    def device(self, requested: str | None) -> torch.device:
        """The device to compile for: ``requested``, or torch_xla's default device."""
        import torch

        return torch.device(requested) if requested else self._torch_xla.device()

    def stats(self) -> CompileStats:
        """The process's compilation counters so far (see ``CompileStats``)."""
        import torch_xla.debug.metrics as met

        from ..precompile import CompileStats

        def counter(name: str) -> int:
            return int(met.counter_value(name) or 0)

        compile_time = met.metric_data("CompileTime")
        return CompileStats(
            compiles=counter("UncachedCompile"),
            compile_seconds=(compile_time[1] / 1e9) if compile_time else 0.0,
            cache_hits=counter("PersistentCacheHit"),
            cache_misses=counter("PersistentCacheMiss"),
            cache_load_failures=counter("PersistentCacheDeserializeFailure"),
        )

    def sync(self) -> None:
        """Run the recorded graphs and wait for the device."""
        synchronize(None)
