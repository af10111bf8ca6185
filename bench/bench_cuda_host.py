"""Host time of one CUDA apply call, ours against xgrammar's calls, and of host-bitmask staging
against a memcpy of the same bytes (needs a GPU).

Part 1, the call with the bitmask on the GPU: small logits (8 x 4,096), so the GPU finishes
each kernel before the host has launched the next and the loop's time per call is the host's.
Each implementation runs 2,000 calls in a row, five times in turn with the others; the table
gives the median over the five of the time per call. ``ours`` is the plain call (fast path);
``ours-general`` gives ``vocab_size`` (checks and plan); ``ours-tritonlaunch`` launches through
Triton's own ``kernel[grid](...)``.

Part 2, a host bitmask of B=256, V=151,936 (4.9 MB; 32 of them rotated, larger than the
host's caches): the host time of our call (copy into pinned memory, one upload, the kernel)
against ``np.copyto`` of the same bitmask into a pageable buffer (one thread), with the
staging copy made by Torch's thread pool (default) and by one NumPy thread. The GPU is
drained before each timed call, so no call waits for an earlier upload.

    python bench/bench_cuda_host.py --json cuda_host.json
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import sys
import time

import numpy as np
import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
import portable_guided as pg
import portable_guided.kernels.cuda as cuda_kernels


def device_bitmask_calls() -> dict[str, float]:
    import xgrammar as xgr

    logits = torch.randn(8, 4096, device="cuda")
    mask = torch.full((8, 128), -1, dtype=torch.int32, device="cuda")
    mask[:, ::3] = 0

    def triton_launch(logits, mask):
        os.environ["PORTABLE_GUIDED_TRITON_FAST_LAUNCH"] = "0"
        try:
            pg.apply_token_mask(logits, mask)
        finally:
            del os.environ["PORTABLE_GUIDED_TRITON_FAST_LAUNCH"]

    calls = {
        "ours": lambda: pg.apply_token_mask(logits, mask),
        "ours-general": lambda: pg.apply_token_mask(logits, mask, vocab_size=4096),
        "ours-tritonlaunch": lambda: triton_launch(logits, mask),
        "xgr-triton": lambda: xgr.apply_token_bitmask_inplace(logits, mask, backend="triton"),
        "xgr-cuda": lambda: xgr.apply_token_bitmask_inplace(logits, mask, backend="cuda"),
        "mul_": lambda: logits.mul_(1.0),
    }
    from portable_guided.kernels import triton_mask

    def plain_launch(logits, mask):
        triton_mask.apply_plain(logits, mask, 8, 4096, 128, 4096, 0)

    calls["ours-apply-plain"] = lambda: plain_launch(logits, mask)
    for _ in range(50):  # compiled, and the plain launch kept
        calls["ours"]()
    compiled = next((c for key, c in triton_mask._compiled.items()
                     if key[0] is triton_mask._PLAIN_SHAPE.kernel), None)
    if compiled is not None:  # the floors: Triton's launcher, then its C function, alone
        run, function, metadata = compiled.run, compiled.function, compiled.packed_metadata
        stream = torch.cuda.current_stream().cuda_stream
        arguments = (logits.data_ptr(), mask.data_ptr(), mask.data_ptr(), 4096, 4096, 128,
                     False, 2048, 1)
        bound = (8, 2, 1, stream, function, metadata, None, None, None, *arguments)
        calls["triton-launcher-only"] = lambda: run(*bound)
        direct = triton_mask._direct_launch(compiled)
        calls["direct-launch-only"] = lambda: direct(8, 2, stream, *arguments)
    import cProfile
    import pstats

    profile = cProfile.Profile()
    profile.enable()
    for _ in range(2000):
        calls["ours"]()
    profile.disable()
    torch.cuda.synchronize()
    pstats.Stats(profile).sort_stats("tottime").print_stats(25)
    rounds: dict[str, list[float]] = {name: [] for name in calls}
    for name, fn in list(calls.items()):
        try:
            for _ in range(50):
                fn()
        except Exception as exc:  # noqa: BLE001 - e.g. xgrammar's CUDA build missing
            print(f"{name} dropped: {type(exc).__name__}: {exc}"[:300], flush=True)
            del calls[name]
    for _ in range(5):
        for name, fn in calls.items():
            torch.cuda.synchronize()
            start = time.perf_counter()
            for _ in range(2000):
                fn()
            rounds[name].append((time.perf_counter() - start) / 2000 * 1e6)
            torch.cuda.synchronize()
    return {name: statistics.median(values) for name, values in rounds.items()}


def staging(reps: int = 60) -> dict[str, float]:
    batch, vocab = 256, 151_936
    words = -(-vocab // 32)
    rng = np.random.default_rng(0)
    masks = [rng.integers(-2**31, 2**31, (batch, words), dtype=np.int64).astype(np.int32)
             for _ in range(32)]
    logits = torch.randn(batch, vocab, device="cuda")
    target = np.empty_like(masks[0])
    out: dict[str, float] = {}

    def timed(fn) -> float:
        samples = []
        for i in range(reps):
            torch.cuda.synchronize()
            start = time.perf_counter()
            fn(masks[i % len(masks)])
            samples.append((time.perf_counter() - start) * 1e3)
        torch.cuda.synchronize()
        return statistics.median(samples)

    out["memcpy_ms"] = timed(lambda m: np.copyto(target, m))
    out["ours_host_ms"] = timed(lambda m: pg.apply_token_mask(logits, torch.from_numpy(m)))
    saved = cuda_kernels.PARALLEL_COPY_MIN_WORDS
    cuda_kernels.PARALLEL_COPY_MIN_WORDS = 1 << 62
    try:
        out["ours_host_one_thread_copy_ms"] = timed(
            lambda m: pg.apply_token_mask(logits, torch.from_numpy(m)))
    finally:
        cuda_kernels.PARALLEL_COPY_MIN_WORDS = saved
    out["memcpy_ms_again"] = timed(lambda m: np.copyto(target, m))
    out["bitmask_mb"] = masks[0].nbytes / 1e6
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    calls = device_bitmask_calls()
    print("host us per call, device bitmask:",
          " ".join(f"{k}={v:.1f}" for k, v in calls.items()), flush=True)
    staged = staging()
    print("host-bitmask staging:", " ".join(f"{k}={v:.3f}" for k, v in staged.items()),
          flush=True)
    result = {
        "meta": {
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "command": "python " + " ".join(sys.argv),
            "device": torch.cuda.get_device_name(),
            "torch": torch.__version__,
            "torch_threads": torch.get_num_threads(),
            "cores": os.cpu_count(),
        },
        "host_us_per_call_device_bitmask": calls,
        "host_bitmask_staging": staged,
    }
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
