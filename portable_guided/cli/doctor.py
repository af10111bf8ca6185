"""``portable-guided doctor``: what is installed, which implementation serves which logits, and
a self-check of each one against the NumPy reference, with timings."""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from importlib.metadata import PackageNotFoundError, version
from typing import TYPE_CHECKING, Any

import numpy as np

from .._frameworks import FRAMEWORKS, device_type_of
from ..kernels import compiled

if TYPE_CHECKING:
    from ..platform import Platform

__all__ = ["register", "run_checks", "Check"]

_PACKAGES = ("numpy", "torch", "paddlepaddle", "torch_xla", "jax", "jaxlib", "xgrammar",
             "llguidance", "triton")


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


def _targets() -> Iterator[tuple[str, str, Platform, str | None, str | None]]:
    """(framework, device label, platform, forced platform name, probe error) for every
    registered platform whose probe finds its device and the framework here, or fails. A
    platform checked on a device another platform claims (``static`` on the CPU) is forced."""
    from ..registry import REGISTRY

    platforms = [REGISTRY.get(name) for name in REGISTRY.names()]
    for framework in FRAMEWORKS:
        for platform in platforms:
            if framework not in platform.kernels:
                continue
            error = None
            try:
                if platform.probe(framework) is not None:
                    continue  # device or framework not here
            except Exception as exc:  # noqa: BLE001 - a broken probe is a finding to report
                error = f"probe failed: {type(exc).__name__}: {exc}"
            label = next(iter(platform.device_types), "cpu")
            forced = None if REGISTRY.for_device(label) is platform else platform.name
            yield framework, label, platform, forced, error


def _device_lines() -> list[str]:
    """The devices of frameworks that enumerate their own (JAX: every backend it found)."""
    import importlib.util

    if importlib.util.find_spec("jax") is None:
        return []
    try:
        import jax

        devices = jax.devices()
    except Exception as exc:  # noqa: BLE001 - a broken backend is a finding to report
        return [f"jax devices: none ({type(exc).__name__}: {exc})"]
    listed = ", ".join(f"{d.platform}:{d.id} ({d.device_kind})" for d in devices)
    return [f"jax devices ({jax.default_backend()} backend): {listed}"]


def _to_numpy(x: Any) -> np.ndarray:
    if isinstance(x, np.ndarray):
        return x
    if type(x).__module__.startswith("torch"):
        return x.detach().cpu().float().numpy()
    if type(x).__module__.startswith("jax"):
        return np.asarray(x.astype("float32"))
    return x.astype("float32").cpu().numpy()


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
    for framework, device, platform, forced, error in _targets():
        if error:
            results.append(Check(framework, device, forced, platform.name, platform.strategy,
                                 "-", False, error, None))
            continue
        try:
            logits = platform.to_device(values.copy(), framework)
            device = device_type_of(logits, framework)
            resolution = pg.resolve(logits, platform=forced)
            # In place on most platforms; a new array where the platform is not (JAX).
            result = pg.apply_token_mask(logits, bitmask, indices=indices, vocab_size=997,
                                         platform=forced)
            got = _to_numpy(result)
            ok = bool(np.array_equal(got, expected))
            detail = "matches reference" if ok else (
                f"{int((got != expected).sum())} entries differ from the reference")
            timed = platform.to_device(timing_values.copy(), framework)
            samples = []
            for _ in range(7):
                platform.synchronize(timed)
                start = time.perf_counter()
                out = pg.apply_token_mask(timed, timing_mask, platform=forced)
                platform.synchronize(out)
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
    for line in _device_lines():
        print(line)
    checks = run_checks(args.batch, args.vocab)
    cpu_kernel = compiled.describe()  # after the checks: their frameworks are loaded now
    print(f"cpu kernel: {cpu_kernel}")
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
            json.dump({"packages": versions, "cpu_kernel": cpu_kernel,
                       "checks": [asdict(c) for c in checks]}, f, indent=1)
    return 1 if failed else 0
