"""Benchmark apply_token_mask side by side with xgrammar's kernels and the memory bound.

CPU (default): our CPU kernel vs xgrammar's ``cpu`` and ``torch_native`` backends and an
in-place read+write of the same logits (the bandwidth bound: ``mul_(1.0)`` on torch's thread
pool, and a one-thread NumPy ``|= 0`` on the bits, like our kernel), for every batch,
vocabulary, dtype and mask kind asked for. Logits buffers are rotated so that the set in use
is larger than the CPU cache; each cell reports the median of its repetitions.

CUDA (``--device cuda``): our CUDA path vs xgrammar's ``triton`` and ``cuda`` backends and the
same read+write bound, timed with CUDA events (see ``time_cell_cuda`` for the three times
reported: per call, device only, host only). ``ours`` takes the host bitmask (what an engine
hands over: one pinned non-blocking upload inside the call), ``ours-devmask`` the bitmask
already on the GPU, as xgrammar's backends do. Each cell also reports GB/s counting the logits
read and written once (``2 * B * V * itemsize / time``) and that as a share of a large
device-to-device copy's rate measured the same way at the start of the run, both from device
times. ``ours-devmask-{dense,element,xtriton,xcuda}`` are ``ours-devmask`` with
``PORTABLE_GUIDED_CUDA_KERNEL`` set to ``triton-dense``, ``triton-element``, ``xgrammar-triton``
or ``xgrammar-cuda``; ``ours-devmask-general`` takes the general path (checks and plan),
``ours-devmask-tritonlaunch`` Triton's own launch; ``word-b*-w*`` are other launch shapes of the
default kernel (columns per program, warps).

``--position after-matmul`` (CPU) times each call right after a real lm_head matmul
(``hidden @ W.T`` with W of shape vocab x ``--hidden``, written into the logits about to be
masked), where a real engine calls the kernel: Torch's OpenMP threads are still spinning and
part of the logits is still in cache. Implementations take turns call by call (one matmul
before every call), so all of them see the same machine load. Variants of ours: ``ours-1t``
(the calling thread only), ``ours-team`` (Torch's OpenMP team at any size),
``ours-own-threads`` (two threads of our own instead of the team) and ``ours-numpy`` (the
NumPy fallback kernel); see ``portable_guided/kernels/compiled.py``.

    python bench/bench_apply.py --json bench/results/apply_cpu.json
    python bench/bench_apply.py --quick            # a smaller grid
    python bench/bench_apply.py --position after-matmul --batches 64 --masks json,half \
        --json bench/results/apply_cpu_after_matmul.json
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import platform as host_platform
import statistics
import sys
import time
from importlib.metadata import version

import numpy as np
import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
import portable_guided as pg

CACHE_BYTES = 128 * 2**20  # rotate through more logits memory than any L3 here
JSON_ALLOWED = 40  # allowed tokens per row in a JSON-like mask
STRING_BLOCKED = 0.03  # share of blocked tokens in a mask inside a JSON string


def make_bitmask(kind: str, batch: int, vocab: int, rng: np.random.Generator) -> np.ndarray:
    words = -(-vocab // 32)
    if kind == "all-allowed":
        return np.full((batch, words), -1, np.int32)
    if kind == "all-blocked":
        return np.zeros((batch, words), np.int32)
    if kind == "string":  # nearly all allowed: tokens with quotes or control bytes blocked
        bitmask = np.full((batch, words), 0xFFFFFFFF, np.uint32)
        for row in range(batch):
            tokens = rng.choice(vocab, int(vocab * STRING_BLOCKED), replace=False)
            bits = np.uint32(1) << (tokens % 32).astype(np.uint32)
            np.bitwise_and.at(bitmask[row], tokens // 32, ~bits)
        return bitmask.view(np.int32)
    if kind.startswith("blocked"):  # e.g. blocked20: each token blocked with probability 20%
        share = float(kind.removeprefix("blocked")) / 100
        allowed = np.ones((batch, words * 32), bool)
        allowed[:, :vocab] = rng.random((batch, vocab)) >= share
        return np.packbits(allowed, axis=1, bitorder="little").view(np.int32)
    if kind == "half":
        return rng.integers(-(2**31), 2**31, (batch, words), dtype=np.int64).astype(np.int32)
    bitmask = np.zeros((batch, words), np.uint32)
    for row in range(batch):
        tokens = rng.choice(vocab, JSON_ALLOWED, replace=False)
        bits = np.uint32(1) << (tokens % 32).astype(np.uint32)
        np.bitwise_or.at(bitmask[row], tokens // 32, bits)
    return bitmask.view(np.int32)


def implementations(device: str):
    import xgrammar as xgr

    def xgr_backend(name):
        def apply(logits, bitmask):
            xgr.apply_token_bitmask_inplace(logits, bitmask, backend=name)

        return apply

    def read_write_one_thread(logits, bitmask):
        view = logits.view(torch.int16 if logits.element_size() == 2 else torch.int32).numpy()
        np.bitwise_or(view, 0, out=view)

    impls = {
        "ours": lambda logits, bitmask: pg.apply_token_mask(logits, bitmask),
        # In-place read+write of the same logits: torch (its thread pool) and one thread.
        "read+write": lambda logits, bitmask: logits.mul_(1.0),
    }
    if device == "cpu":
        impls["ours-1t"] = with_env(PORTABLE_GUIDED_CPU_THREADS="1")
        impls["ours-team"] = always_in_team
        impls["ours-own-threads"] = own_threads
        impls["ours-numpy"] = with_env(PORTABLE_GUIDED_CPU_KERNEL="numpy")
        impls["read+write-1t"] = read_write_one_thread
    if device == "cpu":
        impls["xgr-cpu"] = xgr_backend("cpu")
        impls["xgr-torch_native"] = xgr_backend("torch_native")
    else:
        from portable_guided.kernels.triton_mask import apply_triton

        def variant(name, **shape):
            return lambda logits, bitmask: apply_triton(logits, bitmask, logits.shape[1], None,
                                                        name, **shape)

        impls["ours-devmask"] = impls["ours"]  # given the device bitmask (see main)
        # The general path (vocab_size given skips the plain-call fast path), and Triton's
        # own launch instead of ours: host time of each step.
        impls["ours-devmask-general"] = lambda logits, bitmask: pg.apply_token_mask(
            logits, bitmask, vocab_size=logits.shape[1])
        impls["ours-devmask-tritonlaunch"] = with_env(PORTABLE_GUIDED_TRITON_FAST_LAUNCH="0")
        impls["ours-devmask-dense"] = with_env(PORTABLE_GUIDED_CUDA_KERNEL="triton-dense")
        impls["ours-devmask-element"] = with_env(PORTABLE_GUIDED_CUDA_KERNEL="triton-element")
        impls["ours-devmask-tiered"] = with_env(PORTABLE_GUIDED_CUDA_KERNEL="triton-tiered")
        impls["ours-devmask-word"] = with_env(PORTABLE_GUIDED_CUDA_KERNEL="triton-word")
        impls["ours-devmask-xtriton"] = with_env(PORTABLE_GUIDED_CUDA_KERNEL="xgrammar-triton")
        impls["ours-devmask-xcuda"] = with_env(PORTABLE_GUIDED_CUDA_KERNEL="xgrammar-cuda")
        # Launch shapes of the word kernel (device time): columns per block, warps, blocks
        # per program.
        for kernel, block, warps, blocks in [
                ("word", 1024, 4, 1), ("word", 1024, 4, 4), ("word", 2048, 4, 1),
                ("word", 2048, 8, 2), ("word", 2048, 8, 4), ("word", 4096, 8, 1),
                ("word", 4096, 8, 2), ("word", 8192, 8, 1), ("word", 4096, 16, 1),
                ("tiered", 2048, 4, 1), ("tiered", 2048, 8, 4), ("tiered", 4096, 8, 1),
                ("tiered", 8192, 8, 1), ("tiered", 4096, 4, 2)]:
            impls[f"{kernel}-b{block}-w{warps}-x{blocks}"] = variant(
                f"triton-{kernel}", block=block, num_warps=warps, blocks=blocks)
        impls["xgr-triton"] = xgr_backend("triton")
        impls["xgr-cuda"] = xgr_backend("cuda")
    return impls


def masked_fill_reference(logits, bitmask):
    """The masked logits by the definition (unpack every bit, ``masked_fill``), on the
    logits' device: a plain formula none of the timed kernels uses."""
    shifts = torch.arange(32, device=logits.device, dtype=torch.int32)
    bits = ((bitmask.to(logits.device).unsqueeze(-1) >> shifts) & 1).flatten(1)
    return logits.masked_fill(bits[:, : logits.shape[1]] == 0, float("-inf"))


def check_result(fn, logits, bitmask, expected) -> None:
    """Raise unless ``fn`` masks a copy of ``logits`` as the reference does."""
    trial = logits.clone()
    fn(trial, bitmask)
    if not torch.equal(trial, expected):
        raise AssertionError("result differs from the reference (masked_fill)")


def copy_bandwidth_gbs(size_bytes: int = 2 << 30, reps: int = 20) -> float:
    """Median rate of a device-to-device copy, bytes read plus bytes written per second."""
    src = torch.empty(size_bytes // 4, dtype=torch.float32, device="cuda").normal_()
    dst = torch.empty_like(src)
    times = []
    for rep in range(reps + 1):
        begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        begin.record()
        dst.copy_(src)
        end.record()
        end.synchronize()
        if rep:
            times.append(begin.elapsed_time(end) / 1e3)
    del src, dst
    return 2 * size_bytes / statistics.median(times) / 1e9


def with_env(**settings):
    """Our apply_token_mask with environment settings (kernel choice, thread count)."""
    def apply(logits, bitmask):
        saved = {name: os.environ.get(name) for name in settings}
        os.environ.update(settings)
        try:
            pg.apply_token_mask(logits, bitmask)
        finally:
            for name, value in saved.items():
                if value is None:
                    del os.environ[name]
                else:
                    os.environ[name] = value

    return apply


def always_in_team(logits, bitmask):
    """The compiled kernel in the OpenMP team at any size (no small-work cut-off)."""
    from portable_guided.kernels import compiled

    saved, compiled.PARALLEL_MIN_TOKENS = compiled.PARALLEL_MIN_TOKENS, 0
    try:
        pg.apply_token_mask(logits, bitmask)
    finally:
        compiled.PARALLEL_MIN_TOKENS = saved


_own_pool = None


def own_threads(logits, bitmask):
    """The compiled kernel on two threads of our own (the calling thread and a pool thread)
    instead of the framework's OpenMP team: the policy the kernel does not use."""
    import concurrent.futures

    from portable_guided.dlpack import host_bits
    from portable_guided.kernels import _cpu_mask
    from portable_guided.kernels.host import NEG_INF_BITS
    from portable_guided.validation import plan_mask

    global _own_pool
    if _own_pool is None:
        _own_pool = concurrent.futures.ThreadPoolExecutor(1)
    plan = plan_mask(logits, bitmask)
    bits = host_bits(logits).reshape(plan.batch, plan.width)
    words, rows = bitmask.numpy(), plan.masked_rows
    half, neg = rows.size // 2, NEG_INF_BITS[plan.dtype]
    other = _own_pool.submit(_cpu_mask.mask_rows, bits, words, rows[half:], rows[half:],
                             plan.vocab_size, neg, 1)
    _cpu_mask.mask_rows(bits, words, rows[:half], rows[:half], plan.vocab_size, neg, 1)
    other.result()


def time_after_matmul(impls, buffers, host_mask, bitmask, hidden, reps):
    """Median seconds per implementation, each call right after an lm_head matmul into the
    logits it masks; implementations take turns call by call, in a rotating order."""
    batch, vocab = buffers[0].shape
    dtype = buffers[0].dtype
    gen = torch.Generator().manual_seed(0)
    weight = torch.randn(vocab, hidden, generator=gen).to(dtype)
    hidden_states = torch.randn(batch, hidden, generator=gen).to(dtype)
    samples = {name: [] for name in impls}
    names = list(impls)
    calls = 0
    for rep in range(reps + 1):  # the first round warms up
        # Each call gets the next buffer and each round starts with the next implementation:
        # the first call of a round was measured up to 1.5x slower than the others.
        for name in names[rep % len(names):] + names[: rep % len(names)]:
            fn = impls[name]
            logits = buffers[calls % len(buffers)]
            calls += 1
            torch.matmul(hidden_states, weight.T, out=logits)
            arg = host_mask if name.startswith("ours") else bitmask
            t0 = time.perf_counter()
            fn(logits, arg)
            if rep:
                samples[name].append(time.perf_counter() - t0)
    return {name: (statistics.median(v), len(v)) for name, v in samples.items()}


def time_cell_cuda(fn, buffers, bitmask, min_reps, budget_s):
    """Three medians in milliseconds over rotated buffers: ``call``, CUDA events around the
    call with the GPU idle before it (what a loop that waits on the host sees); ``device``,
    the same events with a ~2 ms sleep kernel queued first, so the host has launched
    everything before the GPU reaches it and the events bracket GPU work only (the bitmask
    upload included, where the call makes one); ``host``, the call's own time on the CPU."""
    fn(buffers[0], bitmask)  # warm-up (compiles, allocations)
    torch.cuda.synchronize()
    call, device, host = [], [], []
    start = time.perf_counter()
    i = 0
    while len(call) < min_reps or (time.perf_counter() - start < budget_s and len(call) < 200):
        for queued in (False, True):
            logits = buffers[i % len(buffers)]
            i += 1
            begin = torch.cuda.Event(enable_timing=True)
            end = torch.cuda.Event(enable_timing=True)
            if queued:
                torch.cuda._sleep(4_000_000)  # ~2 ms at the H100/H200 clock
            begin.record()
            t0 = time.perf_counter()
            fn(logits, bitmask)
            t1 = time.perf_counter()
            end.record()
            end.synchronize()
            (device if queued else call).append(begin.elapsed_time(end))
            if queued:
                host.append((t1 - t0) * 1e3)
    return {"call": statistics.median(call), "device": statistics.median(device),
            "host": statistics.median(host), "reps": len(call)}


def time_cell(fn, buffers, bitmask, device, min_reps, budget_s):
    """Median seconds of ``fn`` over rotated buffers (at least ``min_reps`` calls)."""
    if device == "cpu":
        time.sleep(0.2)  # let the previous implementation's spinning OpenMP threads go idle
    fn(buffers[0], bitmask)  # warm-up (compiles, allocations)
    samples: list[float] = []
    start = time.perf_counter()
    i = 0
    def more() -> bool:
        in_budget = time.perf_counter() - start < budget_s and len(samples) < 200
        return len(samples) < min_reps or in_budget

    while more():
        logits = buffers[i % len(buffers)]
        i += 1
        if device == "cuda":
            begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            begin.record()
            fn(logits, bitmask)
            end.record()
            end.synchronize()
            samples.append(begin.elapsed_time(end) / 1e3)
        else:
            t0 = time.perf_counter()
            fn(logits, bitmask)
            samples.append(time.perf_counter() - t0)
    return statistics.median(samples), len(samples)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--batches", default="1,8,64,256")
    parser.add_argument("--vocabs", default="49152,129280,151936")
    parser.add_argument("--dtypes", default="float32,bfloat16")
    parser.add_argument("--masks", default="json,half,all-allowed")
    parser.add_argument("--impls", default=None, help="comma list; default: all")
    parser.add_argument("--quick", action="store_true", help="batch 1,64; vocab 129280; float32")
    parser.add_argument("--min-reps", type=int, default=7)
    parser.add_argument("--budget", type=float, default=0.5, help="seconds per cell")
    parser.add_argument("--json", default=None, help="write results here")
    parser.add_argument("--threads", type=int, default=None, help="torch intra-op threads")
    parser.add_argument("--position", default="isolated", choices=["isolated", "after-matmul"],
                        help="after-matmul: an lm_head matmul right before every call (CPU)")
    parser.add_argument("--hidden", type=int, default=576,
                        help="lm_head input size for --position after-matmul (SmolLM2: 576)")
    parser.add_argument("--reps", type=int, default=15, help="calls per implementation and "
                        "cell with --position after-matmul")
    args = parser.parse_args()
    if args.quick:
        args.batches, args.vocabs, args.dtypes = "1,64", "129280", "float32"

    if args.threads:
        torch.set_num_threads(args.threads)
    rng = np.random.default_rng(0)
    load_start = os.getloadavg()[0]
    impls = implementations(args.device)
    if args.impls:
        impls = {k: v for k, v in impls.items() if k in args.impls.split(",")}
    copy_gbs = copy_bandwidth_gbs() if args.device == "cuda" else None
    if copy_gbs:
        print(f"device-to-device copy: {copy_gbs:.0f} GB/s (read + write)", flush=True)
    failed: dict[str, str] = {}
    rows = []
    for dtype_name in args.dtypes.split(","):
        dtype = getattr(torch, dtype_name)
        for vocab in map(int, args.vocabs.split(",")):
            for batch in map(int, args.batches.split(",")):
                size = batch * vocab * dtype.itemsize
                count = max(2, math.ceil(CACHE_BYTES / size))
                buffers = [torch.randn(batch, vocab, device=args.device).to(dtype)
                           for _ in range(count)]
                for mask in args.masks.split(","):
                    host_mask = torch.from_numpy(make_bitmask(mask, batch, vocab, rng))
                    bitmask = host_mask.to(args.device)
                    cell = {"batch": batch, "vocab": vocab, "dtype": dtype_name, "mask": mask}
                    if args.position == "after-matmul":
                        timed = time_after_matmul(impls, buffers, host_mask, bitmask,
                                                  args.hidden, args.reps)
                        for name, (median, reps) in timed.items():
                            cell[name] = median * 1e3
                            cell[f"{name}_reps"] = reps
                        rows.append(cell)
                        print(format_row(cell, impls), flush=True)
                        continue
                    expected = None
                    if args.device == "cuda":  # every implementation's result is checked
                        expected = masked_fill_reference(buffers[0], bitmask)
                    for name, fn in list(impls.items()):
                        on_host = name.startswith("ours") and "devmask" not in name
                        arg = host_mask if on_host else bitmask
                        try:
                            if expected is not None and name != "read+write":
                                check_result(fn, buffers[0], arg, expected)
                            if args.device == "cuda":
                                timed = time_cell_cuda(fn, buffers, arg, args.min_reps,
                                                       args.budget)
                                median, reps = timed["call"] / 1e3, timed["reps"]
                            else:
                                median, reps = time_cell(fn, buffers, arg, args.device,
                                                         args.min_reps, args.budget)
                        except Exception as exc:  # noqa: BLE001 - one backend failing must not end the run
                            failed[name] = f"{type(exc).__name__}: {exc}"[:500]
                            print(f"{name} failed, dropped: {failed[name]}", flush=True)
                            del impls[name]
                            continue
                        cell[name] = median * 1e3
                        cell[f"{name}_reps"] = reps
                        if copy_gbs:
                            cell[f"{name}_device"] = timed["device"]
                            cell[f"{name}_host"] = timed["host"]
                            gbs = 2 * size / (timed["device"] / 1e3) / 1e9
                            cell[f"{name}_gbs"] = gbs
                            cell[f"{name}_of_copy"] = gbs / copy_gbs
                    rows.append(cell)
                    print(format_row(cell, impls), flush=True)
                del buffers

    meta = {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "command": "python " + " ".join(sys.argv),
        "device": torch.cuda.get_device_name() if args.device == "cuda" else cpu_name(),
        "cores": os.cpu_count(),
        "torch": torch.__version__,
        "torch_threads": torch.get_num_threads(),
        "position": args.position,
        "hidden": args.hidden if args.position == "after-matmul" else None,
        "numpy": np.__version__,
        "xgrammar": version("xgrammar"),
        "unit": "milliseconds, median",
        # Other processes on shared cores change thread-pool timings several fold.
        "load_avg_start_end": [load_start, os.getloadavg()[0]],
        "copy_gbs": copy_gbs,
        "failed": failed,
    }
    if args.device == "cuda":
        meta |= {"cuda": torch.version.cuda, "driver": _driver_version(),
                 "triton": version("triton"), "timing": "CUDA events around each call"}
    if args.json:
        os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
        with open(args.json, "w") as f:
            json.dump({"meta": meta, "results": rows}, f, indent=1)
    print(json.dumps(meta))


def format_row(cell: dict, impls: dict) -> str:
    head = f"{cell['dtype']:>8} V={cell['vocab']:>6} B={cell['batch']:>3} {cell['mask']:>11}"
    times = " ".join(f"{k}={cell[k]:8.3f}" for k in impls if k in cell)
    ours = cell.get("ours")
    ratios = ""
    if ours:
        for ref in ("xgr-cpu", "xgr-triton", "ours-numpy"):
            if ref in cell:
                ratios += f" speedup_vs_{ref}={cell[ref] / ours:5.1f}x"
        if "read+write" in cell:
            ratios += f" ours/rw={ours / cell['read+write']:4.2f}"
        if "ours_of_copy" in cell:
            ratios += " | device ms " + " ".join(
                f"{k}={cell[k + '_device']:.3f}" for k in impls if k + "_device" in cell)
            ratios += " | host ms " + " ".join(
                f"{k}={cell[k + '_host']:.3f}" for k in impls if k + "_host" in cell)
            ratios += (f" | of copy: ours={100 * cell['ours_of_copy']:3.0f}%"
                       f" devmask={100 * cell.get('ours-devmask_of_copy', 0):3.0f}%")
        if "read+write-1t" in cell:
            ratios += f" ours/rw1t={ours / cell['read+write-1t']:4.2f}"
    return f"{head} {times}{ratios}"


def _driver_version() -> str | None:
    import subprocess

    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=30, check=False)
        return out.stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None


def cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return host_platform.processor() or "unknown CPU"


if __name__ == "__main__":
    main()
