"""Token-mask formulations on JAX, side by side in one run (issue 20).

Per cell (dtype x batch x vocab), each variant is a jitted function of ``(logits, bitmask)``
with the bitmask already on the device, timed to ``block_until_ready``; variants are
interleaved round by round so machine noise hits them alike, and the median is reported:

- ``ours``: ``portable_guided.jax.mask_logits`` (each bit shifted to the sign bit and spread
  by an arithmetic shift, then an integer blend of the logits' bit patterns with -inf's);
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

Usage::

    .venv-jax-cpu/bin/python bench/bench_jax.py --json bench/results/jax_cpu_s8.json
"""

from __future__ import annotations

import argparse
import datetime
import json
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
    "ours": ours, "shift_where": shift_where, "tpu_inference": tpu_inference,
    "bit_table": bit_table, "read_write": read_write,
}


def _expected(values: np.ndarray, bitmask: np.ndarray) -> np.ndarray:
    bits = np.unpackbits(bitmask.view(np.uint8), axis=1, bitorder="little")
    return np.where(bits[:, : values.shape[1]].astype(bool), values, -np.inf)


def run_cell(dtype: str, batch: int, vocab: int, rounds: int, rng: np.random.Generator
             ) -> dict[str, Any]:
    words = -(-vocab // 32)
    values = rng.standard_normal((batch, vocab)).astype(np.float32)
    # JSON-like masks: about 1% of tokens allowed (99% blocked), bit 31 in use.
    bitmask = np.where(rng.random((batch, words)) < 0.01, -1, 0).astype(np.int32)
    bitmask[:, 0] |= np.int32(-(2**31))
    device_mask = jax.device_put(bitmask)
    # XLA-owned logits (device_put may alias the NumPy buffer, which cannot be donated).
    base = (jax.device_put(values) * 1).astype(dtype)
    scale = jnp.asarray(1, dtype)
    base_f32 = np.asarray(base.astype(jnp.float32))
    expected = _expected(base_f32, bitmask)

    fns, live = {}, {}
    for name, fn in VARIANTS.items():
        for donate in (False, True):
            key = f"{name}{'_donated' if donate else ''}"
            fns[key] = jax.jit(fn, donate_argnums=(0,) if donate else ())
            arg = scale if name == "read_write" else device_mask
            live[key] = fns[key](base + 0, arg)  # compile, and a buffer of its own
            live[key].block_until_ready()
            if name != "read_write" and not donate:
                got = np.asarray(live[key].astype(jnp.float32))
                if not np.array_equal(got, expected):
                    raise AssertionError(f"{key} differs from the expected mask ({dtype}, "
                                         f"{batch}x{vocab})")
    samples: dict[str, list[float]] = {key: [] for key in fns}
    samples["apply_token_mask"] = []
    pg.apply_token_mask(base, bitmask).block_until_ready()  # compiles its executable
    for _ in range(rounds):
        for key, fn in fns.items():
            arg = scale if key.startswith("read_write") else device_mask
            x = live[key] if key.endswith("_donated") else base
            start = time.perf_counter()
            out = fn(x, arg)
            out.block_until_ready()
            samples[key].append(time.perf_counter() - start)
            if key.endswith("_donated"):
                live[key] = out  # the next round donates this step's result
            else:
                del out
        start = time.perf_counter()
        pg.apply_token_mask(base, bitmask).block_until_ready()
        samples["apply_token_mask"].append(time.perf_counter() - start)
    medians = {key: statistics.median(s[1:]) * 1e3 for key, s in samples.items()}
    best_other = min(medians["tpu_inference_donated"], medians["bit_table_donated"],
                     medians["shift_where_donated"])
    return {
        "dtype": dtype, "batch": batch, "vocab": vocab,
        "logits_mb": round(values.size * jnp.dtype(dtype).itemsize / 1e6, 1),
        "ms": {key: round(value, 3) for key, value in medians.items()},
        "ours_donated_vs_best_other_donated": round(medians["ours_donated"] / best_other, 2),
        "ours_donated_vs_read_write_donated": round(
            medians["ours_donated"] / medians["read_write_donated"], 2),
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
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--json", default=None, help="write the results here")
    args = parser.parse_args(argv)
    rng = np.random.default_rng(0)
    load_before = os.getloadavg()
    cells = []
    header = (f"{'dtype':9} {'B':>4} {'V':>7} {'ours':>7} {'ours/d':>7} {'sw/d':>7} {'tpu':>7} "
              f"{'tpu/d':>7} "
              f"{'table':>7} {'table/d':>7} {'rw':>7} {'rw/d':>7} {'apply':>7} "
              f"{'vs best/d':>9} {'vs rw/d':>8}")
    print(header)
    for dtype in args.dtypes.split(","):
        for vocab in (int(v) for v in args.vocabs.split(",")):
            for batch in (int(b) for b in args.batches.split(",")):
                cell = run_cell(dtype, batch, vocab, args.rounds, rng)
                cells.append(cell)
                ms = cell["ms"]
                print(f"{dtype:9} {batch:>4} {vocab:>7} {ms['ours']:7.2f} "
                      f"{ms['ours_donated']:7.2f} {ms['shift_where_donated']:7.2f} "
                      f"{ms['tpu_inference']:7.2f} "
                      f"{ms['tpu_inference_donated']:7.2f} {ms['bit_table']:7.2f} "
                      f"{ms['bit_table_donated']:7.2f} {ms['read_write']:7.2f} "
                      f"{ms['read_write_donated']:7.2f} {ms['apply_token_mask']:7.2f} "
                      f"{cell['ours_donated_vs_best_other_donated']:9.2f} "
                      f"{cell['ours_donated_vs_read_write_donated']:8.2f}", flush=True)
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
        "statistic": "median ms per call (first round dropped), bitmask already on the device "
                     "except apply_token_mask (host bitmask, eager)",
        "cells": cells,
    }
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
