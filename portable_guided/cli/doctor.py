"""``portable-guided doctor``: what is installed, which implementation serves which logits, and
a self-check of each one against the NumPy reference, with timings."""

from __future__ import annotations

import argparse
import importlib.util
import json
import statistics
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from importlib.metadata import PackageNotFoundError, version
from typing import Any

import numpy as np

__all__ = ["register", "run_checks", "Check"]

_PACKAGES = ("numpy", "torch", "paddlepaddle", "torch_xla", "xgrammar", "llguidance", "triton")


@dataclass
class Check:
    """One implementation's self-check result."""

    framework: str
    device: str
    forced: str | None
    platform: str
    strategy: str
    kernel: str
    ok: bool
    detail: str
    apply_ms: float | None


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the ``doctor`` subcommand."""
    parser = subparsers.add_parser(
        "doctor", help="detect frameworks and devices and self-check every implementation"
    )
    parser.add_argument("--batch", type=int, default=16, help="rows for the timing (default 16)")
    parser.add_argument("--vocab", type=int, default=32_000, help="columns for the timing")
    parser.add_argument("--json", default=None, help="also write the results to this file")
    parser.set_defaults(func=_run)


def _package_versions() -> dict[str, str | None]:
    versions: dict[str, str | None] = {}
    for name in _PACKAGES:
        try:
            versions[name] = version(name)
        except PackageNotFoundError:
            versions[name] = None
    return versions


def _targets() -> Iterator[tuple[str, str, str | None, Callable[[np.ndarray], Any]]]:
    """(framework, device, forced platform, numpy -> tensor) for everything usable here."""
    yield "numpy", "cpu", None, lambda a: a
    if importlib.util.find_spec("torch"):
        import torch

        yield "torch", "cpu", None, torch.from_numpy
        yield "torch", "cpu", "static", torch.from_numpy
        if torch.cuda.is_available():
            yield "torch", "cuda", None, lambda a: torch.from_numpy(a).cuda()
        if hasattr(torch, "xpu") and torch.xpu.is_available():
            yield "torch", "xpu", None, lambda a: torch.from_numpy(a).to("xpu")
        if importlib.util.find_spec("torch_xla"):
            import torch_xla

            yield "torch", "xla", None, lambda a: torch.from_numpy(a).to(torch_xla.device())
    if importlib.util.find_spec("paddle"):
        import paddle

        yield "paddle", "cpu", None, lambda a: paddle.to_tensor(a, place=paddle.CPUPlace())
        yield "paddle", "cpu", "static", lambda a: paddle.to_tensor(a, place=paddle.CPUPlace())
        if paddle.device.is_compiled_with_cuda() and paddle.device.cuda.device_count() > 0:
            yield "paddle", "cuda", None, lambda a: paddle.to_tensor(a, place=paddle.CUDAPlace(0))
        if paddle.device.is_compiled_with_xpu():
            yield "paddle", "xpu", None, lambda a: paddle.to_tensor(a, place=paddle.XPUPlace(0))


def _to_numpy(x: Any) -> np.ndarray:
    if isinstance(x, np.ndarray):
        return x
    if type(x).__module__.startswith("torch"):
        return x.detach().cpu().float().numpy()
    return x.astype("float32").cpu().numpy()


def _sync(x: Any) -> None:
    """Wait for queued device work, so timings measure the apply."""
    if type(x).__module__.startswith("torch"):
        device = x.device.type
        if device == "cuda":
            import torch

            torch.cuda.synchronize()
        elif device == "xla":
            import torch_xla

            torch_xla.sync()
            import torch_xla.core.xla_model as xm

            xm.wait_device_ops()
    elif not isinstance(x, np.ndarray) and not x.place.is_cpu_place():
        import paddle

        paddle.device.synchronize()


def run_checks(batch: int = 16, vocab: int = 32_000, seed: int = 0) -> list[Check]:
    """Self-check every implementation available here against the NumPy reference."""
    import portable_guided as pg

    rng = np.random.default_rng(seed)
    small_vocab = 1_000
    words = -(-small_vocab // 32)
    values = rng.standard_normal((6, small_vocab)).astype(np.float32)
    bitmask = rng.integers(-(2**31), 2**31, (6, words), dtype=np.int64).astype(np.int32)
    bitmask[1] = 0
    bitmask[1, 3] = 0b1011  # a sparse, JSON-like row
    bitmask[2] = -1
    indices = [0, 1, 2, 4]
    expected = pg.reference_apply_token_mask(values, bitmask, indices=indices, vocab_size=997)

    timing_values = rng.standard_normal((batch, vocab)).astype(np.float32)
    timing_mask = np.zeros((batch, -(-vocab // 32)), np.int32)
    timing_mask[:, :: max(1, vocab // 32 // 40)] = 0b1  # about 40 allowed tokens per row

    results = []
    for framework, device, forced, convert in _targets():
        try:
            logits = convert(values.copy())
            resolution = pg.resolve(logits, platform=forced)
            pg.apply_token_mask(logits, bitmask, indices=indices, vocab_size=997, platform=forced)
            got = _to_numpy(logits)
            ok = bool(np.array_equal(got, expected))
            detail = "matches reference" if ok else (
                f"{int((got != expected).sum())} entries differ from the reference")
            timed = convert(timing_values.copy())
            samples = []
            for _ in range(7):
                _sync(timed)
                start = time.perf_counter()
                pg.apply_token_mask(timed, timing_mask, platform=forced)
                _sync(timed)
                samples.append(time.perf_counter() - start)
            results.append(Check(framework, device, forced, resolution.platform.name,
                                 resolution.strategy, resolution.kernel_name, ok, detail,
                                 statistics.median(samples[1:]) * 1e3))
        except Exception as exc:  # noqa: BLE001 - report, keep checking the others
            results.append(Check(framework, device, forced, "-", "-", "-", False,
                                 f"{type(exc).__name__}: {exc}", None))
    return results


def _run(args: argparse.Namespace) -> int:
    versions = _package_versions()
    print("portable_guided doctor")
    print("packages: " + ", ".join(f"{k} {v}" for k, v in versions.items() if v))
    missing = [k for k, v in versions.items() if not v]
    if missing:
        print("not installed: " + ", ".join(missing))
    checks = run_checks(args.batch, args.vocab)
    header = f"{'framework':9} {'device':6} {'platform':16} {'strategy':20} {'check':6} " \
             f"{f'apply {args.batch}x{args.vocab}':>18}  kernel"
    print(header)
    print("-" * len(header))
    for c in checks:
        platform = c.platform + (" (forced)" if c.forced else "")
        timing = f"{c.apply_ms:8.3f} ms" if c.apply_ms is not None else "-"
        print(f"{c.framework:9} {c.device:6} {platform:16} {c.strategy:20} "
              f"{'ok' if c.ok else 'FAIL':6} {timing:>18}  {c.kernel}")
        if not c.ok:
            print(f"    {c.detail}")
    failed = sum(not c.ok for c in checks)
    print(f"{len(checks) - failed} of {len(checks)} implementations match the reference")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"packages": versions, "checks": [asdict(c) for c in checks]}, f, indent=1)
    return 1 if failed else 0
