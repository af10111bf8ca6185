"""JAX (CPU, TPU, GPU): on-device unpack, ahead-of-time compiled executables, a new array.

JAX arrays are immutable, so this platform returns a new masked array (``in_place=False``).
Its device types are JAX's backends (``jax:cpu``, ``jax:tpu``, ``jax:gpu``): JAX brings its
own kernels, so a JAX array on the CPU is not served by the ``cpu`` platform. Logits on
another JAX backend resolve to ``static`` (which has no JAX kernel); force this platform with
``platform="jax"``. ``precompile`` counts JAX's own compile events (``jax.monitoring``) and
uses JAX's persistent compilation cache through :class:`JaxPrecompile`.
"""

from __future__ import annotations

import threading
from typing import Any

from ..platform import Platform
from ._devices import missing

PLATFORM = Platform(
    name="jax",
    description="JAX arrays on any JAX device: on-device unpack, AOT-compiled per shape, "
                "returns a new array",
    device_types=("jax:cpu", "jax:tpu", "jax:gpu"),
    kernels={"jax": "portable_guided.kernels.static_jax:apply_static_jax"},
    strategy="static shapes, new array",
    static_shapes=True,
    in_place=False,
    install_hints={"jax": "pip install 'portable-guided[jax]' (jax[cpu], jax[tpu] or jax[cuda12])"},
    hooks={
        "probe": "portable_guided.platforms.jax:probe",
        "to_device": "portable_guided.platforms.jax:to_device",
        "synchronize": "portable_guided.platforms.jax:synchronize",
        "precompile": "portable_guided.platforms.jax:JaxPrecompile",
    },
)


def probe(framework: str) -> str | None:
    """JAX installed (it always has a CPU backend)."""
    return missing("jax")


def to_device(array: Any, framework: str) -> Any:
    """``array`` on JAX's default device (a copy: ``device_put`` may otherwise share the NumPy
    buffer, which JAX then cannot donate)."""
    import jax
    import numpy as np

    return jax.device_put(np.array(array, copy=True))


def synchronize(tensor: Any) -> None:
    """Wait until ``tensor`` (a ``jax.Array``) is computed."""
    if tensor is not None:
        tensor.block_until_ready()


_EVENTS = {"compile_events": 0, "compile_event_seconds": 0.0, "cache_hits": 0,
           "cache_misses": 0, "cache_load_seconds": 0.0}
_LISTENING = threading.Lock()
_listener_registered = False


def _on_duration(event: str, duration: float, **_: Any) -> None:
    # JAX times compile-or-load: this event also fires when an executable comes from the
    # persistent cache (then a cache hit and its retrieval time are recorded too).
    if event == "/jax/core/compile/backend_compile_duration":
        _EVENTS["compile_events"] += 1
        _EVENTS["compile_event_seconds"] += duration
    elif event == "/jax/compilation_cache/cache_retrieval_time_sec":
        _EVENTS["cache_load_seconds"] += duration


def _on_event(event: str, **_: Any) -> None:
    if event == "/jax/compilation_cache/cache_hits":
        _EVENTS["cache_hits"] += 1
    elif event == "/jax/compilation_cache/cache_misses":
        _EVENTS["cache_misses"] += 1


def count_compiles() -> None:
    """Start counting this process's XLA compilations (JAX's own monitoring events); idempotent."""
    global _listener_registered
    import jax.monitoring

    with _LISTENING:
        if not _listener_registered:
            jax.monitoring.register_event_duration_secs_listener(_on_duration)
            jax.monitoring.register_event_listener(_on_event)
            _listener_registered = True


class JaxPrecompile:
    """JAX for ``precompile``: devices, compile counters, the persistent cache, warm-up."""

    def __init__(self, cache_dir: str | None) -> None:
        import jax

        count_compiles()
        if cache_dir is not None:
            import os

            current = jax.config.jax_compilation_cache_dir
            if current and os.path.abspath(current) != os.path.abspath(cache_dir):
                # JAX keeps one persistent cache per process and does not move it once used:
                # the new executables would silently land in the old directory.
                raise RuntimeError(
                    f"JAX's persistent compilation cache is already {current!r} in this "
                    f"process; cannot use {cache_dir!r} too (one cache directory per process)"
                )
            os.makedirs(cache_dir, exist_ok=True)
            jax.config.update("jax_compilation_cache_dir", cache_dir)
            # Cache every executable, however small or fast to compile.
            jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
            jax.config.update("jax_persistent_cache_min_entry_size_bytes", -1)
        self._jax = jax

    def device(self, requested: str | None) -> Any:
        """``requested`` (``"cpu"``, ``"tpu:1"``...) as a ``jax.Device``, or JAX's default."""
        if not requested:
            return self._jax.devices()[0]
        backend, _, index = requested.partition(":")
        try:
            devices = self._jax.devices(backend)
        except RuntimeError as error:  # a backend JAX does not have here
            raise ValueError(f"no JAX backend {backend!r} for device {requested!r}: "
                             f"{error}") from None
        if not (index or "0").isdigit() or int(index or 0) >= len(devices):
            raise ValueError(f"no JAX device {requested!r}: the {backend} backend has "
                             f"{len(devices)} ({', '.join(str(d) for d in devices)})")
        return devices[int(index or 0)]

    def stats(self) -> Any:
        """The process's compile counters so far (a ``CompileStats``): graphs compiled, not
        executables loaded from the persistent cache."""
        from ..precompile import CompileStats

        hits = int(_EVENTS["cache_hits"])
        return CompileStats(
            compiles=max(0, int(_EVENTS["compile_events"]) - hits),
            compile_seconds=max(0.0, float(_EVENTS["compile_event_seconds"])
                                - float(_EVENTS["cache_load_seconds"])),
            cache_hits=hits,
            cache_misses=int(_EVENTS["cache_misses"]),
        )

    def sync(self) -> None:
        """Nothing to wait for: compiling is synchronous."""

    def warmup(self, rows: int, width: int, dtype: str, device: Any) -> None:
        """Compile the apply executable of one bucket ahead of time."""
        from ..kernels.static_jax import warmup

        warmup(rows, width, dtype, device)
