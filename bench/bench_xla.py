"""Benchmark the static-shape strategy on XLA, per batch bucket.

For each bucket, side by side in one run (medians of ``--repeats``):

- ``apply``: ``apply_token_mask`` on device logits with a host bitmask (one upload of the
  bitmask, one precompiled graph), synchronized;
- ``identity``: an unmasked graph that reads and writes the same logits (``logits * one``,
  with ``one`` a device scalar so XLA cannot fold it away): the floor of any apply graph;
- ``round trip``: what engines without a device path do: logits to the host, mask there with
  the CPU kernel, and back to the device.

Also the total precompile time of every bucket, and the compilations seen while timing (must
be 0). ``--ab-unpack`` instead times the current bit unpack against the previous one (a 3-D
boolean, before commit 9d45faf), interleaved in one process, both through ``apply_token_mask``. Run in the xla-cpu lane's venv (``PJRT_DEVICE=CPU``: XLA's CPU client, so "device" and
host share memory and the round trip is a lower bound of what it costs over PCIe)::

    PJRT_DEVICE=CPU .venv-xla-cpu/bin/python bench/bench_xla.py --json bench/results/xla-cpu.json
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform as host_platform
import statistics
import sys
import time
from importlib.metadata import version

os.environ.setdefault("PJRT_DEVICE", "CPU")
os.environ.setdefault("CPU_NUM_DEVICES", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np
import torch
import torch_xla
import torch_xla.core.xla_model as xm
import torch_xla.debug.metrics as met

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
import portable_guided as pg
from portable_guided.precompile import precompile

JSON_ALLOWED = 40  # allowed tokens per row in a JSON-like mask


def json_like_bitmask(rows: int, vocab: int, rng: np.random.Generator) -> np.ndarray:
    """A few dozen allowed tokens per row, as a grammar in the middle of a JSON value allows."""
    bitmask = np.zeros((rows, -(-vocab // 32)), np.uint32)
    for row in range(rows):
        tokens = rng.choice(vocab, JSON_ALLOWED, replace=False)
        np.bitwise_or.at(bitmask[row], tokens // 32, np.uint32(1) << (tokens % 32).astype(np.uint32))
    return bitmask.view(np.int32)


def _sync() -> None:
    torch_xla.sync()
    xm.wait_device_ops()


def _compiles() -> int:
    return int(met.counter_value("UncachedCompile") or 0)


def _median_ms(step, repeats: int) -> float:
    step()  # warm: compiles anything new outside the timed loop
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        step()
        times.append(time.perf_counter() - start)
    return 1e3 * statistics.median(times)


def bench_bucket(rows: int, vocab: int, dtype: torch.dtype, repeats: int,
                 rng: np.random.Generator) -> dict:
    device = torch_xla.device()
    host_logits = torch.from_numpy(rng.standard_normal((rows, vocab), dtype=np.float32)).to(dtype)
    logits = host_logits.to(device)
    one = torch.ones((), dtype=dtype).to(device)
    bitmask = torch.from_numpy(json_like_bitmask(rows, vocab, rng))
    _sync()

    def apply() -> None:
        pg.apply_token_mask(logits, bitmask)
        _sync()

    def identity() -> None:
        logits.copy_(logits * one)
        _sync()

    def round_trip() -> None:
        nonlocal logits
        on_host = logits.cpu()
        pg.apply_token_mask(on_host, bitmask)
        logits = on_host.to(device)
        _sync()

    before = _compiles()
    apply_ms = _median_ms(apply, repeats)
    apply_compiles = _compiles() - before  # precompiled: must be 0, warm call included
    identity_ms = _median_ms(identity, repeats)
    round_trip_ms = _median_ms(round_trip, repeats)
    return {
        "rows": rows,
        "apply_ms": round(apply_ms, 3),
        "identity_ms": round(identity_ms, 3),
        "round_trip_ms": round(round_trip_ms, 3),
        "apply_over_identity": round(apply_ms / identity_ms, 2),
        "round_trip_over_apply": round(round_trip_ms / apply_ms, 2),
        "logits_mb": round(rows * vocab * host_logits.element_size() / 2**20, 1),
        "apply_compiles": apply_compiles,
    }


def _boolean_3d_masked_where(table: torch.Tensor, mask: torch.Tensor) -> None:
    """The bit unpack before commit 9d45faf: a ``(rows, words, 32)`` boolean, reshaped to 2-D
    and sliced. Kept here to measure what the current 2-D formulation gained."""
    from portable_guided.kernels.static_common import BIT_VALUES

    key = str(table.device)
    if key not in _BIT_TABLES:
        _BIT_TABLES[key] = torch.from_numpy(BIT_VALUES.copy()).to(table.device)
    allowed = (mask.unsqueeze(-1) & _BIT_TABLES[key]) != 0
    allowed = allowed.reshape(mask.shape[0], -1)[:, : table.shape[1]]
    table.copy_(torch.where(allowed, table, float("-inf")))


_BIT_TABLES: dict[str, torch.Tensor] = {}


def ab_unpack(vocab: int, repeats: int, rows_list: tuple[int, ...]) -> list[dict]:
    """The previous bit unpack vs the current one, through ``apply_token_mask``, alternating
    order each repetition."""
    from portable_guided.kernels import static_torch

    current = static_torch._masked_where
    arms = {"previous": _boolean_3d_masked_where, "current": current}
    rng = np.random.default_rng(0)
    device = torch_xla.device()
    results = []
    for dtype in (torch.bfloat16, torch.float32):
        for rows in rows_list:
            logits = torch.from_numpy(rng.standard_normal((rows, vocab), dtype=np.float32))
            logits = logits.to(dtype).to(device)
            bitmask = torch.from_numpy(json_like_bitmask(rows, vocab, rng))
            _sync()
            times: dict[str, list[float]] = {name: [] for name in arms}
            try:
                for i in range(repeats + 1):
                    order = list(arms) if i % 2 else list(reversed(arms))
                    for name in order:
                        static_torch._masked_where = arms[name]
                        start = time.perf_counter()
                        pg.apply_token_mask(logits, bitmask)
                        _sync()
                        if i:  # the first round compiles both graphs
                            times[name].append(time.perf_counter() - start)
            finally:
                static_torch._masked_where = current
            old, new = (1e3 * statistics.median(times[name]) for name in arms)
            results.append({"dtype": str(dtype).split(".")[-1], "rows": rows,
                            "previous_ms": round(old, 3), "current_ms": round(new, 3),
                            "speedup": round(old / new, 2)})
            print(f"{results[-1]['dtype']:>9} rows={rows:>4} previous={old:8.2f} ms "
                  f"current={new:8.2f} ms speed-up={old / new:5.2f}x")
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--max-batch", type=int, default=256)
    parser.add_argument("--vocab", type=int, default=151936)
    parser.add_argument("--dtype", default="bfloat16", choices=("float32", "bfloat16"))
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--json", default=None, help="write the results here")
    parser.add_argument("--ab-unpack", action="store_true",
                        help="compare the previous bit unpack with the current one instead")
    args = parser.parse_args(argv)

    if args.ab_unpack:
        result = {
            "benchmark": "bench/bench_xla.py --ab-unpack",
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "machine": f"{host_platform.machine()}, {os.cpu_count()} cores, shared with 3 other "
                       "engineers' jobs (timings are noisy)",
            "pjrt_device": os.environ["PJRT_DEVICE"],
            "torch_xla": version("torch_xla"),
            "vocab": args.vocab,
            "repeats": args.repeats,
            "cases": ab_unpack(args.vocab, args.repeats, (8, 64, 256)),
        }
        if args.json:
            with open(args.json, "w", encoding="utf-8") as f:
                json.dump(result, f, indent=2)
        return 0

    dtype = getattr(torch, args.dtype)
    report = precompile(max_batch=args.max_batch, vocab=args.vocab, dtype=args.dtype, progress=False)
    rng = np.random.default_rng(0)
    buckets = []
    for bucket in report.buckets:
        buckets.append(bench_bucket(bucket.rows, args.vocab, dtype, args.repeats, rng))
        buckets[-1]["precompile_s"] = round(bucket.seconds, 3)
        buckets[-1]["precompile_graphs"] = bucket.graphs_compiled
    result = {
        "benchmark": "bench/bench_xla.py",
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "machine": f"{host_platform.machine()}, {os.cpu_count()} cores, shared with 3 other "
                   "engineers' jobs (timings are noisy)",
        "pjrt_device": os.environ["PJRT_DEVICE"],
        "torch": version("torch"),
        "torch_xla": version("torch_xla"),
        "vocab": args.vocab,
        "dtype": args.dtype,
        "mask": f"JSON-like: {JSON_ALLOWED} allowed tokens per row, every row constrained",
        "repeats": args.repeats,
        "precompile_total_s": round(report.seconds, 3),
        "precompile_graphs": report.graphs_compiled,
        "apply_compiles_after_precompile": sum(b["apply_compiles"] for b in buckets),
        "buckets": buckets,
    }
    print(f"XLA ({result['pjrt_device']}) vocab={args.vocab} {args.dtype}, medians of "
          f"{args.repeats}; precompile {report.seconds:.2f} s for {report.graphs_compiled} graphs")
    print(f"{'rows':>5} {'MB':>6} {'apply ms':>9} {'identity ms':>12} {'round trip ms':>14} "
          f"{'apply/id':>9} {'trip/apply':>11}")
    for b in buckets:
        print(f"{b['rows']:>5} {b['logits_mb']:>6} {b['apply_ms']:>9.3f} {b['identity_ms']:>12.3f} "
              f"{b['round_trip_ms']:>14.3f} {b['apply_over_identity']:>9.2f} "
              f"{b['round_trip_over_apply']:>11.2f}")
    print(f"apply compilations after precompile: {result['apply_compiles_after_precompile']}")
    if args.json:
        os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(result, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
