"""What the SGLang plugin's Outlines hook costs against SGLang's own apply: Outlines' mask is
a bool tensor (True = blocked) that SGLang applies with one ``logits.masked_fill_(vocab_mask,
-inf)`` (``OutlinesGrammar.apply_vocab_mask``); the hook packs it into 32-bit words and
applies them through ``apply_token_mask``. Side by side in one run, on the same logits and
masks (B=64, V=151,936, 99% blocked and all allowed), interleaved in a fresh random order
each round, medians, every result checked equal:

- ``masked_fill``: Outlines' apply as SGLang runs it;
- ``hook``: the plugin's apply (``integrations.sglang.apply.apply_outlines``: the pack, then
  ``apply_token_mask``);
- ``pack_s11``: session 11's pack (the allowed bools, padded, then ``numpy.packbits``) and
  ``apply_token_mask``, for reference;
- ``apply_only``: ``apply_token_mask`` on words already packed (what the pack costs on top).

    PYTHONPATH=. python bench/bench_outlines_mask.py --json bench/results/outlines_mask_cpu_s12.json
"""

from __future__ import annotations

import argparse
import datetime
import json
import random
import statistics
import sys
import time
from typing import Any

import numpy as np
import torch

import portable_guided as pg
from portable_guided.harness.maskbench import machine_note
from portable_guided.integrations.sglang.apply import apply_outlines, outlines_words


def _packed_s11(blocked: torch.Tensor) -> torch.Tensor:
    allowed = ~blocked.numpy()
    width = -(-allowed.shape[1] // 32) * 32
    padded = np.zeros((allowed.shape[0], width), dtype=bool)
    padded[:, : allowed.shape[1]] = allowed
    return torch.from_numpy(np.packbits(padded, axis=1, bitorder="little").view(np.int32))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--vocab", type=int, default=151_936)
    p.add_argument("--rounds", type=int, default=30)
    p.add_argument("--json", dest="out", default=None)
    args = p.parse_args()
    rng = np.random.default_rng(0)
    cells = []
    for dtype in (torch.float32, torch.bfloat16):
        for share in (0.99, 0.0):
            blocked = torch.from_numpy(rng.random((args.batch, args.vocab)) < share)
            base = torch.randn(args.batch, args.vocab).to(dtype)
            words = outlines_words(blocked)
            expected = base.masked_fill(blocked, float("-inf"))
            paths = {
                "masked_fill": lambda x, b=blocked: x.masked_fill_(b, float("-inf")),
                "hook": lambda x, b=blocked: apply_outlines(x, b),
                "pack_s11": lambda x, b=blocked: pg.apply_token_mask(x, _packed_s11(b)),
                "apply_only": lambda x, w=words: pg.apply_token_mask(x, w),
            }
            times: dict[str, list[float]] = {k: [] for k in paths}
            order = list(paths)
            for _ in range(args.rounds):
                random.shuffle(order)
                for name in order:
                    fn = paths[name]
                    x = base.clone()  # (not timed)
                    t0 = time.perf_counter()
                    fn(x)
                    times[name].append(time.perf_counter() - t0)
                    if not torch.equal(x, expected):
                        raise AssertionError(f"{name} differs from masked_fill ({dtype}, {share})")
            ms = {k: round(statistics.median(v) * 1e3, 3) for k, v in times.items()}
            cell = {"dtype": str(dtype).split(".")[-1], "blocked": share, **ms,
                    "hook_vs_masked_fill": round(ms["hook"] / ms["masked_fill"], 2)}
            cells.append(cell)
            print(cell, flush=True)
    if args.out:
        out: dict[str, Any] = {"command": " ".join(["python", *sys.argv]),
                               "date": datetime.date.today().isoformat(),
                               "machine": machine_note(), "batch": args.batch,
                               "vocab": args.vocab, "rounds": args.rounds, "cells": cells}
        with open(args.out, "w", encoding="utf-8") as fh:
            json.dump(out, fh, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
