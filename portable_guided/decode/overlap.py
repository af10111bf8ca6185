"""Overlap CPU grammar work with the device's step.

An engine's step has a device part (launch the forward; on CUDA this returns at once and the
GPU works on) and a CPU part (accept the previous step's tokens, fill this step's bitmask).
:class:`OverlappedStep` runs the CPU part on a worker thread while the calling thread runs the
device part, then joins both. On a synchronous device (PyTorch or Paddle on the CPU) the forward
itself blocks the calling thread, so the worker gives the same overlap; the framework releases
the GIL inside its kernels. With ``overlap=False`` the same two parts run one after the other,
CPU part first, which is the order a naive engine uses; results are identical either way.

Example::

    step = OverlappedStep()
    mask_ready, logits = step.run(lambda: runtime.fill_bitmask(reqs, buf), lambda: model(ids))
"""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TypeVar

__all__ = ["OverlappedStep", "StepTimes"]

C = TypeVar("C")
D = TypeVar("D")


@dataclass
class StepTimes:
    """Accumulated seconds: CPU work, device-part calls, and the CPU work left visible."""

    cpu_s: float = 0.0
    device_call_s: float = 0.0
    visible_cpu_s: float = 0.0
    steps: int = 0


class OverlappedStep:
    """Run ``cpu_work`` on a worker thread while the caller runs ``device_work``.

    ``visible_cpu_s`` in :attr:`times` is how long the caller waited for the CPU part after its
    device part returned (with overlap) or the whole CPU part (without): the grammar cost the
    step could not hide.
    """

    def __init__(self, *, overlap: bool = True) -> None:
        self.overlap = overlap
        self.times: StepTimes = StepTimes()
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="pg-grammar") if overlap else None

    def run(self, cpu_work: Callable[[], C], device_work: Callable[[], D]) -> tuple[C, D]:
        """Run both parts; returns ``(cpu_result, device_result)``.

        An exception from either part is raised here, after both parts finished, so the
        caller's state is never half-stepped.
        """
        t = self.times
        if self._pool is None:
            t0 = time.perf_counter()
            cpu = cpu_work()
            t1 = time.perf_counter()
            dev = device_work()
            t2 = time.perf_counter()
            t.cpu_s += t1 - t0
            t.visible_cpu_s += t1 - t0
            t.device_call_s += t2 - t1
            t.steps += 1
            return cpu, dev
        cpu_elapsed = [0.0]

        def timed() -> C:
            s = time.perf_counter()
            try:
                return cpu_work()
            finally:
                cpu_elapsed[0] = time.perf_counter() - s

        fut = self._pool.submit(timed)
        t0 = time.perf_counter()
        try:
            dev = device_work()
        finally:
            t1 = time.perf_counter()
            try:
                cpu = fut.result()
            finally:
                t2 = time.perf_counter()
                t.cpu_s += cpu_elapsed[0]
                t.device_call_s += t1 - t0
                t.visible_cpu_s += t2 - t1
                t.steps += 1
        return cpu, dev

    def close(self) -> None:
        """Stop the worker thread."""
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None

    def __enter__(self) -> OverlappedStep:  # noqa: PYI034
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
