"""Device time of JAX's token-mask formulations, read from the profiler's trace (issue 37).

``bench_jax.py`` times calls on the host, which on a GPU measures JAX's dispatch as much as
the kernel. Here each formulation of ``bench_jax.py`` (donated: the logits' buffer becomes
the result's) runs ``--calls`` times back to back inside a profiler annotation of its own, in
turn with the others in one ``jax.profiler.trace`` per round, ``--rounds`` times; the trace's
events on the device's lanes that start inside a formulation's annotation (every kernel and
copy its calls ran, on each stream) are summed and divided by the calls. That is the device
time per call, launch gaps excluded, one figure per round; the table gives the median over
rounds and, per cell, ``ours`` against the fastest other formulation (median of the per-round
ratios). Logits rotate through a pool larger than the GPU's L2 cache. Before timing, every
formulation's result is checked against the NumPy expectation.

On a backend without device lanes in its trace (XLA:CPU runs the kernels on host threads)
the host events of the executable's kernels are summed instead, so the script also runs here.

    JAX_PLATFORMS=cuda python bench/bench_jax_device.py --json jax_cuda_device.json
"""

from __future__ import annotations

import argparse
import datetime
import glob
import gzip
import json
import math
import os
import shutil
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench_jax import FORMULATIONS, VARIANTS, _expected

NAMES = ["ours", *FORMULATIONS, "read_write"]


def traced_round(work: dict[str, tuple[Any, list[tuple[Any, ...]]]]
                 ) -> tuple[dict[str, tuple[float, int]], dict[str, list[Any]]]:
    """Run each ``name: (call, argument tuples)`` of ``work`` in one profiler trace, each
    inside an annotation named after it and waited for before the next. Returns, per name,
    the summed duration (us) and count of the device's events that started inside its
    annotation (the device's clock is the host's in JAX's traces), and its outputs."""
    folder = tempfile.mkdtemp(prefix="pg-jax-trace-")
    outputs = {}
    with jax.profiler.trace(folder):
        for name, (call, args_list) in work.items():
            with jax.profiler.TraceAnnotation(f"pgbench_{name}"):
                outs = [call(*args) for args in args_list]
                jax.block_until_ready(outs)
            outputs[name] = outs
    paths = glob.glob(os.path.join(folder, "**", "*.trace.json.gz"), recursive=True)
    if len(paths) != 1:
        raise RuntimeError(f"expected one trace file under {folder}, found {paths}")
    with gzip.open(paths[0], "rt", encoding="utf-8") as f:
        trace = json.load(f)
    shutil.rmtree(folder, ignore_errors=True)
    events = trace["traceEvents"] if isinstance(trace, dict) else trace
    processes = {e["pid"]: e.get("args", {}).get("name", "") for e in events
                 if e.get("ph") == "M" and e.get("name") == "process_name"}
    device = {pid for pid, name in processes.items() if name.startswith("/device:")}
    spans = [e for e in events if e.get("ph") == "X"]
    windows = {e["name"][len("pgbench_"):]: (float(e["ts"]), float(e["ts"]) + float(e["dur"]))
               for e in spans if e.get("name", "").startswith("pgbench_")}
    if device:
        kernels = [e for e in spans if e.get("pid") in device]
    else:  # XLA:CPU: the executable's kernels are host events named after their fusions
        kernels = [e for e in spans if "fusion" in e.get("name", "")
                   and not e["name"].startswith("end:")]
    if device and not any(begin <= float(e["ts"]) < end for e in kernels
                          for begin, end in windows.values()):
        raise RuntimeError(f"no device event inside the annotations; processes {processes}, "
                           f"{len(kernels)} device events")
    totals = {}
    for name, (begin, end) in windows.items():
        inside = [e for e in kernels if begin <= float(e["ts"]) < end]
        totals[name] = (sum(float(e.get("dur", 0)) for e in inside), len(inside))
    missing = set(work) - set(totals)
    if missing:
        raise RuntimeError(f"no annotation in the trace for {sorted(missing)}")
    return totals, outputs


def run_cell(dtype: str, batch: int, vocab: int, rounds: int, calls: int, pool_mb: float,
             rng: np.random.Generator) -> dict[str, Any]:
    words = -(-vocab // 32)
    values = rng.standard_normal((batch, vocab)).astype(np.float32)
    bitmask = np.where(rng.random((batch, words)) < 0.01, -1, 0).astype(np.int32)  # JSON-like
    bitmask[:, 0] |= np.int32(-(2**31))
    device_mask = jax.device_put(bitmask)
    base = (jax.device_put(values) * 1).astype(dtype)
    scale = jnp.asarray(1, dtype)
    expected = _expected(np.asarray(base.astype(jnp.float32)), bitmask)
    size = values.size * jnp.dtype(dtype).itemsize
    # Every call of a round takes a buffer of its own (donated ones are replaced after it).
    pool = max(calls * len(NAMES), math.ceil(pool_mb * 1e6 / size))
    fns = {}
    for name in NAMES:
        plain = jax.jit(VARIANTS[name])
        if name != "read_write":
            got = np.asarray(plain(base + 0, device_mask).astype(jnp.float32))
            if not np.array_equal(got, expected):
                raise AssertionError(f"{name} differs from the expected mask ({dtype}, "
                                     f"{batch}x{vocab})")
        fns[name] = jax.jit(VARIANTS[name], donate_argnums=(0,))
    buffers = [base + 0 for _ in range(pool)]
    turn = 0
    per_call: dict[str, list[float]] = {name: [] for name in NAMES}
    events: dict[str, int] = {}
    order = list(NAMES)
    for round_ in range(rounds + 1):
        rng.shuffle(order)
        work = {}
        used: dict[str, list[int]] = {}
        for name in order:
            arg = scale if name == "read_write" else device_mask
            used[name] = [(turn + i) % pool for i in range(calls)]
            turn = (turn + calls) % pool
            work[name] = (fns[name], [(buffers[slot], arg) for slot in used[name]])
        totals, outputs = traced_round(work)
        for name, outs in outputs.items():
            for slot, out in zip(used[name], outs):
                buffers[slot] = out  # donated: the result holds the input's buffer
        if round_ > 0:  # the first round warms the profiler and the executables
            for name, (total, count) in totals.items():
                per_call[name].append(total / calls)
                events[name] = count // calls
    medians = {name: statistics.median(v) for name, v in per_call.items()}
    best = min(FORMULATIONS, key=lambda name: medians[name])
    ratios = [mine / theirs for mine, theirs in zip(per_call["ours"], per_call[best])]
    return {
        "dtype": dtype, "batch": batch, "vocab": vocab, "logits_mb": round(size / 1e6, 2),
        "device_us": {name: round(value, 2) for name, value in medians.items()},
        "device_events_per_call": events,
        "fastest_other": best,
        "ours_vs_fastest_other": round(statistics.median(ratios), 3),
        "ours_gbs": round(2 * size / medians["ours"] / 1e3, 1),
        "read_write_gbs": round(2 * size / medians["read_write"] / 1e3, 1),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--batches", default="8,64,256")
    parser.add_argument("--vocabs", default="49152,151936")
    parser.add_argument("--dtypes", default="float32,bfloat16")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--calls", type=int, default=20, help="calls per traced sample")
    parser.add_argument("--pool-mb", type=float, default=256,
                        help="logits buffers taken in turn, in MB (> the L2 cache)")
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)
    rng = np.random.default_rng(0)
    cells = []
    print(f"{'dtype':9} {'B':>4} {'V':>7} " + " ".join(f"{n[:9]:>9}" for n in NAMES)
          + "  fastest other   ours/it", flush=True)
    for dtype in args.dtypes.split(","):
        for vocab in map(int, args.vocabs.split(",")):
            for batch in map(int, args.batches.split(",")):
                cell = run_cell(dtype, batch, vocab, args.rounds, args.calls, args.pool_mb,
                                rng)
                cells.append(cell)
                us = cell["device_us"]
                print(f"{dtype:9} {batch:>4} {vocab:>7} "
                      + " ".join(f"{us[n]:9.2f}" for n in NAMES)
                      + f"  {cell['fastest_other']:>13} {cell['ours_vs_fastest_other']:8.3f}",
                      flush=True)
    result = {
        "command": " ".join([os.path.relpath(sys.executable), *sys.argv]),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "jax": jax.__version__, "backend": jax.default_backend(),
        "devices": [str(d) for d in jax.devices()],
        "statistic": "device time per call in us (the trace's device events over the calls),"
                     " median over rounds; ratio: median of per-round ratios",
        "rounds": args.rounds, "calls": args.calls, "pool_mb": args.pool_mb,
        "cells": cells,
    }
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
