"""Token-mask formulations on JAX, side by side in one run (issue 20).

Per cell (dtype x batch x vocab), each variant is a jitted function of ``(logits, bitmask)``
with the bitmask already on the device, timed to ``block_until_ready``:

- ``ours``: ``portable_guided.jax.mask_logits`` (the integer blend below, plus the argument
  handling of a general function);
- ``sign_where``: each bit shifted to the sign bit, ``< 0``, ``where(allowed, x, -inf)``;
- ``int_blend``: the sign spread over the word by an arithmetic shift, then an integer blend
  of the logits' bit patterns with -inf's (``mask_logits`` since session 8);
- ``shift_where``: ``mask_logits`` of session 7 (uint32 logical shift by ``arange(32)``,
  ``& 1``, ``where``);
- ``tpu_inference``: the formulation of vLLM tpu-inference's structured decoding manager
  (int32 ``right_shift`` by ``arange(32)``, ``& 1 == 0``, a per-row ``require`` flag, inside
  ``lax.cond(any(require))``);
- ``bit_table``: ``(word[..., None] & table) != 0`` with a table of the 32 single-bit words;
- ``read_write``: ``logits * s`` with ``s`` a runtime scalar: a plain on-device read and
  write of the logits, the floor of any masking graph;

each donated (the logits' buffer reused for the result) and not. Also ``apply_token_mask``
(eager: host bitmask expanded, moved once, precompiled executable, new array).

How it measures: the calls take their logits in turn from one pool of buffers, together at
least ``--pool-mb`` (default 96 MB, 3x this VM's 32 MB L3), so no call finds its input in the
cache (``--pool-mb 0``: one buffer, warm); with ``--chain K`` a sample is K calls issued back
to back and waited for once (on an accelerator: dispatch overlapped with the device's work,
the cost per call of a decode loop); the variants run in a new random order each round; the first two rounds are dropped.
Besides each variant's median, ``ours`` (donated) is compared round by round with every other
donated variant: the median of the per-round ratios and a 95% bootstrap interval. ``ours`` is
the same graph as one of the named formulations (``SAME_AS_OURS``); that pair's ratio shows
how far apart two identical graphs measure, i.e. the noise of the machine.

Usage::

    .venv-jax-cpu/bin/python bench/bench_jax.py --json bench/results/jax_cpu_s16.json
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import portable_guided as pg
import portable_guided.jax as pgj

BITS = jnp.asarray((np.uint32(1) << np.arange(32, dtype=np.uint32)).view(np.int32))


def ours(logits: jax.Array, bitmask: jax.Array) -> jax.Array:
    return pgj.mask_logits(logits, bitmask)


def sign_where(logits: jax.Array, bitmask: jax.Array) -> jax.Array:
    signs = bitmask[:, :, None] << (31 - jnp.arange(32, dtype=jnp.int32))
    allowed = (signs < 0).reshape(logits.shape[0], -1)[:, : logits.shape[1]]
    return jnp.where(allowed, logits, jnp.array(-jnp.inf, logits.dtype))


def int_blend(logits: jax.Array, bitmask: jax.Array) -> jax.Array:
    keep = (bitmask[:, :, None] << (31 - jnp.arange(32, dtype=jnp.int32))) >> 31
    bits_type = jnp.int32 if logits.dtype == jnp.float32 else jnp.int16
    keep = keep.reshape(logits.shape[0], -1)[:, : logits.shape[1]].astype(bits_type)
    bits = lax.bitcast_convert_type(logits, bits_type)
    neg = lax.bitcast_convert_type(jnp.array(-jnp.inf, logits.dtype), bits_type)
    return lax.bitcast_convert_type((bits & keep) | (neg & ~keep), logits.dtype)


def shift_where(logits: jax.Array, bitmask: jax.Array) -> jax.Array:
    words = lax.bitcast_convert_type(bitmask, jnp.uint32)
    blocked = ((words[:, :, None] >> jnp.arange(32, dtype=jnp.uint32)) & 1) == 0
    blocked = blocked.reshape(logits.shape[0], -1)[:, : logits.shape[1]]
    return jnp.where(blocked, jnp.array(-jnp.inf, logits.dtype), logits)


def tpu_inference(logits: jax.Array, bitmask: jax.Array) -> jax.Array:
    require = jnp.ones((logits.shape[0],), bool)  # every row constrained, as in the issue
    shifts = jnp.arange(32)

    def apply(x: jax.Array) -> jax.Array:
        unpacked = (jnp.right_shift(bitmask[:, :, None], shifts[None, None, :]) & 1) == 0
        unpacked = unpacked.reshape(x.shape[0], -1)[:, : x.shape[1]]
        return jnp.where(unpacked & require[:, None], -jnp.inf, x).astype(x.dtype)

    return lax.cond(jnp.any(require), apply, lambda x: x, logits)


def bit_table(logits: jax.Array, bitmask: jax.Array) -> jax.Array:
    allowed = (bitmask[:, :, None] & BITS) != 0
    allowed = allowed.reshape(logits.shape[0], -1)[:, : logits.shape[1]]
    return jnp.where(allowed, logits, jnp.array(-jnp.inf, logits.dtype))


def read_write(logits: jax.Array, scale: jax.Array) -> jax.Array:
    return logits * scale


VARIANTS: dict[str, Callable[[jax.Array, jax.Array], jax.Array]] = {
    "ours": ours, "sign_where": sign_where, "int_blend": int_blend,
    "shift_where": shift_where, "tpu_inference": tpu_inference, "bit_table": bit_table,
    "read_write": read_write,
}
# The named formulation that is the same graph as `ours` for each dtype (see mask_logits).
SAME_AS_OURS = {"float32": "int_blend", "bfloat16": "int_blend", "float16": "int_blend"}
FORMULATIONS = [name for name in VARIANTS if name not in ("ours", "read_write")]


def _expected(values: np.ndarray, bitmask: np.ndarray) -> np.ndarray:
    bits = np.unpackbits(bitmask.view(np.uint8), axis=1, bitorder="little")
    return np.where(bits[:, : values.shape[1]].astype(bool), values, -np.inf)


def _paired(mine: list[float], theirs: list[float], rng: np.random.Generator
            ) -> dict[str, float]:
    """Median of the per-round ratios mine/theirs and its 95% bootstrap interval."""
    ratios = np.asarray(mine) / np.asarray(theirs)
    boots = np.median(rng.choice(ratios, (2000, ratios.size)), axis=1)
    return {"median": round(float(np.median(ratios)), 3),
            "ci95": [round(float(np.quantile(boots, 0.025)), 3),
                     round(float(np.quantile(boots, 0.975)), 3)]}


def run_cell(dtype: str, batch: int, vocab: int, rounds: int, pool_mb: float, chain: int,
             rng: np.random.Generator) -> dict[str, Any]:
    words = -(-vocab // 32)
    values = rng.standard_normal((batch, vocab)).astype(np.float32)
    # JSON-like masks: about 1% of tokens allowed (99% blocked), bit 31 in use.
    bitmask = np.where(rng.random((batch, words)) < 0.01, -1, 0).astype(np.int32)
    bitmask[:, 0] |= np.int32(-(2**31))
    device_mask = jax.device_put(bitmask)
    # XLA-owned logits (device_put may alias the NumPy buffer, which cannot be donated).
    base = (jax.device_put(values) * 1).astype(dtype)
    scale = jnp.asarray(1, dtype)
    expected = _expected(np.asarray(base.astype(jnp.float32)), bitmask)
    pool = max(chain, math.ceil(pool_mb * 1e6 / (values.size * jnp.dtype(dtype).itemsize)))

    fns = {}
    for name, fn in VARIANTS.items():
        for donate in (False, True):
            key = f"{name}{'_donated' if donate else ''}"
            fns[key] = jax.jit(fn, donate_argnums=(0,) if donate else ())
            arg = scale if name == "read_write" else device_mask
            got = fns[key](base + 0, arg)  # compiles
            checked = name != "read_write" and not donate
            if checked and not np.array_equal(np.asarray(got.astype(jnp.float32)), expected):
                raise AssertionError(f"{key} differs from the expected mask ({dtype}, "
                                     f"{batch}x{vocab})")
    # Top-level operations per call (fusions, library calls and conditionals in the entry
    # computation): one for every variant on XLA:CPU (tpu_inference's `lax.cond` folds away:
    # its flag is constant here); a graph split into several kernels on another backend shows
    # up here.
    kernels = {}
    for name in VARIANTS:
        arg = scale if name == "read_write" else device_mask
        text = fns[f"{name}_donated"].lower(base, arg).compile().as_text()
        entry = text[text.rfind("ENTRY"):]
        kernels[name] = sum(entry.count(f" {op}(") for op in ("fusion", "custom-call",
                                                                "conditional"))
    # One pool of buffers for all variants, taken in turn: a buffer's placement in memory
    # (huge pages or not, which NUMA node) then cannot favour one variant. Every variant keeps
    # the values masked (idempotent) or scaled by 1, so the buffers stay valid logits.
    buffers = [base + 0 for _ in range(pool)]
    turn = 0
    samples: dict[str, list[float]] = {key: [] for key in fns}
    samples["apply_token_mask"] = []
    pg.apply_token_mask(base, bitmask).block_until_ready()  # compiles its executable
    order = [*fns, "apply_token_mask"]
    for _ in range(rounds):
        rng.shuffle(order)
        for key in order:
            slots = [(turn + i) % pool for i in range(chain)]
            turn = (turn + chain) % pool
            if key == "apply_token_mask":
                call, arg = pg.apply_token_mask, bitmask
            else:
                call, arg = fns[key], scale if key.startswith("read_write") else device_mask
            start = time.perf_counter()
            outs = [call(buffers[slot], arg) for slot in slots]
            jax.block_until_ready(outs)
            samples[key].append((time.perf_counter() - start) / chain)
            if key.endswith("_donated"):
                for slot, out in zip(slots, outs):
                    buffers[slot] = out  # the input was donated: its buffer is the result's
            del outs
    kept = {key: s[2:] for key, s in samples.items()}
    medians = {key: statistics.median(s) * 1e3 for key, s in kept.items()}
    ours = kept["ours_donated"]
    same = SAME_AS_OURS[dtype]
    vs = {name: _paired(ours, kept[f"{name}_donated"], rng) for name in FORMULATIONS}
    others = [name for name in FORMULATIONS if name != same]
    best = max(others, key=lambda name: vs[name]["median"])  # the one ours gains least on
    return {
        "dtype": dtype, "batch": batch, "vocab": vocab, "pool": pool,
        "logits_mb": round(values.size * jnp.dtype(dtype).itemsize / 1e6, 1),
        "ms": {key: round(value, 3) for key, value in medians.items()},
        "kernels": kernels,
        "ours_donated_vs_donated": vs,
        "ours_donated_vs_best_other_donated": {"formulation": best, **vs[best]},
        "ours_donated_vs_same_graph_donated": {"formulation": same, **vs[same]},
        "ours_donated_vs_read_write_donated": _paired(ours, kept["read_write_donated"], rng),
    }


def _summary(cells: list[dict[str, Any]]) -> dict[str, Any]:
    """Ranges over the cells, and the cells where ours (donated) is slower than the best other
    formulation beyond doubt (its whole 95% interval above 1) or beyond the noise band (its
    median above the largest ratio two identical graphs showed in this run)."""
    def spread(key: str) -> list[float]:
        values = [cell[key]["median"] for cell in cells]
        return [min(values), max(values)]

    same = spread("ours_donated_vs_same_graph_donated")
    return {
        "ours_vs_best_other": spread("ours_donated_vs_best_other_donated"),
        "ours_vs_read_write": spread("ours_donated_vs_read_write_donated"),
        "identical_graphs": same,
        "slower_beyond_doubt": [
            f"{c['dtype']} {c['batch']}x{c['vocab']}" for c in cells
            if c["ours_donated_vs_best_other_donated"]["ci95"][0] > 1],
        "slower_beyond_noise": [
            f"{c['dtype']} {c['batch']}x{c['vocab']}" for c in cells
            if c["ours_donated_vs_best_other_donated"]["median"] > same[1]],
    }


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--batches", default="8,32,128,256")
    parser.add_argument("--vocabs", default="49152,151936")
    parser.add_argument("--dtypes", default="float32,bfloat16")
    parser.add_argument("--rounds", type=int, default=41)
    parser.add_argument("--pool-mb", type=float, default=96,
                        help="logits buffers the calls take in turn, in MB (> the cache)")
    parser.add_argument("--chain", type=int, default=1,
                        help="calls per sample, issued back to back with one wait at the end "
                             "(1: each call waited for; more: the steady-state cost per call, "
                             "dispatch overlapped with the device's work)")
    parser.add_argument("--json", default=None, help="write the results here")
    args = parser.parse_args(argv)
    rng = np.random.default_rng(0)
    load_before = os.getloadavg()
    cells = []
    header = (f"{'dtype':9} {'B':>4} {'V':>7} {'ours':>7} {'ours/d':>7} {'sign/d':>7} "
              f"{'blend/d':>7} {'sw/d':>7} {'tpu/d':>7} {'table/d':>7} {'rw/d':>7} "
              f"{'apply':>7}  {'vs best other/d [95%]':>27}  {'vs same/d':>9}  {'vs rw/d':>7}")
    print(header)
    for dtype in args.dtypes.split(","):
        for vocab in (int(v) for v in args.vocabs.split(",")):
            for batch in (int(b) for b in args.batches.split(",")):
                cell = run_cell(dtype, batch, vocab, args.rounds, args.pool_mb, args.chain,
                                rng)
                cells.append(cell)
                ms = cell["ms"]
                best = cell["ours_donated_vs_best_other_donated"]
                low, high = best["ci95"]
                print(f"{dtype:9} {batch:>4} {vocab:>7} {ms['ours']:7.3f} "
                      + " ".join(f"{ms[key + '_donated']:7.3f}" for key in (
                          "ours", "sign_where", "int_blend", "shift_where", "tpu_inference",
                          "bit_table", "read_write"))
                      + f" {ms['apply_token_mask']:7.3f}  {best['formulation'][:13]:>13} "
                      f"{best['median']:.2f} [{low:.2f},{high:.2f}]  "
                      f"{cell['ours_donated_vs_same_graph_donated']['median']:9.2f}  "
                      f"{cell['ours_donated_vs_read_write_donated']['median']:7.2f}", flush=True)
    summary = _summary(cells)
    print("\n".join(f"{key}: {value}" for key, value in summary.items()))
    result = {
        "command": " ".join([os.path.relpath(sys.executable), *sys.argv]),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "machine": {
            "platform": platform.platform(), "cpu": _cpu_model(), "cpus": os.cpu_count(),
            "load_average_before": load_before, "load_average_after": os.getloadavg(),
            "jax": jax.__version__, "backend": jax.default_backend(),
            "devices": [str(d) for d in jax.devices()],
        },
        "rounds": args.rounds,
        "pool_mb": args.pool_mb,
        "chain": args.chain,
        "statistic": "median ms per call (first two rounds dropped), bitmask already on the "
                     "device except apply_token_mask (host bitmask, eager); ratios: median of "
                     "per-round ratios, 95% bootstrap interval",
        "summary": summary,
        "cells": cells,
    }
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
