"""SGLang 0.5.23's CPU ``apply_vocab_mask`` paths vs portable_guided's, per decode step.

One batch of logits (B=64, V=151,936: Qwen's width), fp32 and bf16, with masks 99% blocked
(a JSON-schema step) and all allowed (free text, or rows without a grammar). Paths, all on
the same logits and masks, interleaved rep by rep in a fresh random order each rep, medians:

- ``sglang_xgrammar``: SGLang's own ``XGrammarGrammar.apply_vocab_mask`` (on CPU:
  xgrammar's CPU kernel), captured before the plugin is loaded;
- ``sglang_llguidance``: SGLang's own ``GuidanceGrammar.apply_vocab_mask`` (llguidance's
  Torch kernel);
- ``ours_xgrammar`` / ``ours_llguidance``: SGLang's same functions with the plugin loaded
  (through SGLang's ``load_plugins()``; the canary has already checked its first call).

``--kernel-threads`` adds the compiled CPU kernel alone on the same buffers, by thread
policy: ``kernel_team`` always joins Torch's OpenMP team (the default before session 8),
``kernel_1t`` the calling thread, ``kernel_auto`` the default now (the calling thread for
light work or after a late team; kernels/_cpu_mask.c). ``--busy N`` keeps N busy-looping
processes running while it measures (a loaded machine, made on purpose).

Each timed call starts from a fresh copy of the logits (the copy is not timed); every result
of every rep is checked equal to SGLang's. Needs the sglang-cpu lane's venv.

    .venv-sglang-cpu/bin/python bench/bench_sglang.py --kernel-threads \
        --json bench/results/sglang_cpu_s8.json
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import random
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def _masks(rows: int, vocab: int, blocked: float, seed: int) -> Any:
    import torch

    words = (vocab + 31) // 32
    if blocked == 0.0:
        return torch.full((rows, words), -1, dtype=torch.int32)
    g = torch.Generator().manual_seed(seed)
    bits = (torch.rand(rows, words * 32, generator=g) >= blocked).view(rows, words, 32)
    values = (bits.to(torch.int64) << torch.arange(32, dtype=torch.int64)).sum(-1)
    return ((values + 2**31) % 2**32 - 2**31).to(torch.int32)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--vocab", type=int, default=151_936)
    parser.add_argument("--reps", type=int, default=20)
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: default)")
    parser.add_argument("--kernel-threads", action="store_true",
                        help="also time the compiled kernel alone per thread policy")
    parser.add_argument("--busy", type=int, default=0,
                        help="busy-looping processes to run meanwhile (a loaded machine)")
    parser.add_argument("--json", type=Path, help="write the results here")
    args = parser.parse_args()
    busy = [subprocess.Popen([sys.executable, "-c", "while True: pass"])
            for _ in range(args.busy)]
    try:
        _run(args)
    finally:
        for process in busy:
            process.kill()
            process.wait()


def _kernel_paths(torch: Any) -> dict[str, Any]:
    """The compiled kernel alone (no Python around it but the call), per thread policy."""
    import numpy as np

    from portable_guided.kernels import _cpu_mask

    team = torch.get_num_threads()

    def call(threads: int) -> Any:
        def run(logits: Any, mask: Any) -> None:
            bf16 = logits.dtype == torch.bfloat16
            bits = (logits.view(torch.int16) if bf16 else logits).numpy()
            rows = np.arange(logits.shape[0], dtype=np.int64)
            _cpu_mask.mask_rows(bits, mask.numpy(), rows, rows, logits.shape[1],
                                0xFF80 if bf16 else 0xFF800000, threads)
        return run

    return {"kernel_team": call(team), "kernel_1t": call(1), "kernel_auto": call(0)}


def _team_stats() -> Any:
    try:
        from portable_guided.kernels import _cpu_mask
    except ImportError:
        return None
    return _cpu_mask.team_stats()


def _run(args: argparse.Namespace) -> None:

    import sglang
    import torch
    from sglang.srt import plugins
    from sglang.srt.constrained.llguidance_backend import GuidanceGrammar
    from sglang.srt.constrained.xgrammar_backend import XGrammarGrammar

    if args.threads:
        torch.set_num_threads(args.threads)
    sglang_xgr = XGrammarGrammar.__dict__["apply_vocab_mask"]
    sglang_llg = GuidanceGrammar.__dict__["apply_vocab_mask"].__func__
    os.environ["SGLANG_PLUGINS"] = "portable_guided"
    plugins.load_plugins()
    from portable_guided.integrations import sglang as plugin

    if sorted(plugin.taken_over()) != ["llguidance", "xgrammar", "xgrammar_static"]:
        raise SystemExit(f"the plugin did not take over: {plugin.taken_over()}")
    paths = {
        "sglang_xgrammar": lambda lg, m: sglang_xgr(None, logits=lg, vocab_mask=m),
        "sglang_llguidance": lambda lg, m: sglang_llg(logits=lg, vocab_mask=m),
        "ours_xgrammar": lambda lg, m: XGrammarGrammar.apply_vocab_mask(None, logits=lg,
                                                                        vocab_mask=m),
        "ours_llguidance": lambda lg, m: GuidanceGrammar.apply_vocab_mask(logits=lg,
                                                                         vocab_mask=m),
    }
    if args.kernel_threads:
        paths.update(_kernel_paths(torch))
    load_before = os.getloadavg()
    cells = []
    for dtype_name, dtype in (("fp32", torch.float32), ("bf16", torch.bfloat16)):
        for mask_name, blocked in (("99% blocked", 0.99), ("all allowed", 0.0)):
            g = torch.Generator().manual_seed(0)
            base = torch.randn(args.batch, args.vocab, generator=g).to(dtype)
            mask = _masks(args.batch, args.vocab, blocked, seed=1)
            work = base.clone()
            expected = base.clone()
            sglang_xgr(None, logits=expected, vocab_mask=mask)
            times: dict[str, list[float]] = {name: [] for name in paths}
            order = random.Random(0)
            for rep in range(args.reps + 2):  # two warm-up reps (the canary, torch's first)
                # A fresh order every rep: a path's cost depends on the one before it
                # (llguidance's kernel leaves Torch's threads in another state than
                # xgrammar's), and a fixed order (or a rotation, which keeps neighbours)
                # favoured whichever path followed the cheapest.
                names = list(paths)
                order.shuffle(names)
                for name in names:
                    fn = paths[name]
                    work.copy_(base)
                    start = time.perf_counter()
                    fn(work, mask)
                    elapsed = time.perf_counter() - start
                    if not torch.equal(work, expected):
                        raise SystemExit(f"{name} differs from SGLang's ({dtype_name}, "
                                         f"{mask_name}, rep {rep})")
                    if rep >= 2:
                        times[name].append(elapsed * 1e3)
            med = {name: round(statistics.median(t), 3) for name, t in times.items()}
            cells.append({"dtype": dtype_name, "mask": mask_name, "median_ms": med,
                          "p90_ms": {name: round(sorted(t)[int(0.9 * len(t))], 3)
                                     for name, t in times.items()},
                          "speedup_vs_sglang_xgrammar": round(
                              med["sglang_xgrammar"] / med["ours_xgrammar"], 2),
                          "speedup_vs_sglang_llguidance": round(
                              med["sglang_llguidance"] / med["ours_llguidance"], 2)})
            print(f"{dtype_name:5} {mask_name:12} " + "  ".join(
                f"{n} {v:8.3f} ms" for n, v in med.items()), flush=True)
    result = {
        "benchmark": "bench/bench_sglang.py",
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "machine": {"platform": platform.platform(), "processor": platform.processor(),
                    "cpus": os.cpu_count(), "torch_threads": torch.get_num_threads()},
        "versions": {"sglang": sglang.__version__, "torch": torch.__version__},
        "batch": args.batch, "vocab": args.vocab, "reps": args.reps, "busy": args.busy,
        "load_average_1min": {"before": round(load_before[0], 2),
                              "after": round(os.getloadavg()[0], 2)},
        "results_identical_to_sglang": True,
        "kernel_team_policy": _team_stats(),
        "cells": cells,
    }
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
