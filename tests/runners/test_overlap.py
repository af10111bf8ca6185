"""OverlappedStep: both parts run, concurrently with overlap, in order without; errors surface."""

from __future__ import annotations

import threading

import pytest

from portable_guided.decode.overlap import OverlappedStep


def test_overlap_runs_cpu_work_while_device_work_runs():
    started = threading.Event()
    with OverlappedStep(overlap=True) as step:
        # The device part can only finish once the CPU part has started: proves concurrency.
        cpu, dev = step.run(
            lambda: (started.set(), threading.current_thread().name)[1],
            lambda: started.wait(timeout=10) and threading.current_thread().name,
        )
    assert cpu.startswith("pg-grammar")
    assert dev == threading.current_thread().name
    assert step.times.steps == 1


def test_without_overlap_cpu_work_runs_first_on_the_caller():
    order: list[str] = []
    step = OverlappedStep(overlap=False)
    cpu, dev = step.run(lambda: order.append("cpu") or 1, lambda: order.append("dev") or 2)
    assert (cpu, dev, order) == (1, 2, ["cpu", "dev"])
    assert step.times.visible_cpu_s == step.times.cpu_s


@pytest.mark.parametrize("overlap", [True, False])
def test_errors_surface_after_both_parts(overlap):
    ran: list[str] = []

    def bad_cpu() -> None:
        raise KeyError("fill failed")

    with OverlappedStep(overlap=overlap) as step:
        with pytest.raises(KeyError, match="fill failed"):
            step.run(bad_cpu, lambda: ran.append("dev"))
        with pytest.raises(RuntimeError, match="forward failed"):
            step.run(lambda: ran.append("cpu"), lambda: (_ for _ in ()).throw(RuntimeError("forward failed")))
    assert ran == (["dev", "cpu"] if overlap else ["cpu"])
