"""The precompile helper: per-bucket report, persistent cache across two processes, errors."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
torch_xla = pytest.importorskip("torch_xla")

import portable_guided as pg
from portable_guided.precompile import precompile

pytestmark = pytest.mark.xla

REPO = Path(__file__).resolve().parents[2]
MAX_BATCH, VOCAB = 32, 1000


def _precompile_process(cache_dir: Path) -> dict:
    """``portable-guided precompile`` in a fresh process; returns its JSON report."""
    env = {**os.environ, "PJRT_DEVICE": os.environ.get("PJRT_DEVICE", "CPU")}
    done = subprocess.run(
        [sys.executable, "-m", "portable_guided", "precompile", "--platform", "xla",
         "--max-batch", str(MAX_BATCH), "--vocab", str(VOCAB), "--dtype", "bfloat16",
         "--cache-dir", str(cache_dir), "--json", "--no-progress"],
        capture_output=True, text=True, cwd=REPO, env=env, timeout=600, check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout)


def _totals(report: dict) -> dict[str, float]:
    keys = ("compiles", "compile_seconds", "cache_hits", "cache_misses", "cache_load_failures")
    return {k: sum(b["stats"][k] for b in report["buckets"]) for k in keys}


def test_second_process_finds_every_graph_in_the_cache(tmp_path: Path) -> None:
    cold = _precompile_process(tmp_path)
    warm = _precompile_process(tmp_path)
    first, second = _totals(cold), _totals(warm)

    buckets = list(pg.bucket_sizes(MAX_BATCH))
    assert [b["rows"] for b in cold["buckets"]] == buckets
    # The first process compiles one graph per bucket and writes each to the cache.
    assert first["compiles"] == len(buckets)
    assert first["cache_misses"] == first["compiles"]
    assert cold["cache_files"] == first["compiles"]
    # The second process looks up the same graphs: their cache keys are stable across
    # processes (nothing process-specific is baked into the graphs).
    assert second["cache_misses"] == 0
    assert warm["cache_files"] == cold["cache_files"]
    found = second["cache_hits"] + second["cache_load_failures"]
    assert found == first["compiles"]
    if second["cache_load_failures"]:
        # torch_xla 2.9 writes executables but its PJRT client cannot deserialize them
        # (pytorch/xla#9094, fix proposed in pytorch/xla#9759); the graphs compile again.
        pytest.xfail(
            f"runtime cannot load cached executables: {second['cache_load_failures']} of "
            f"{found} failed, recompiled in {second['compile_seconds']:.2f}s "
            f"(cold: {first['compile_seconds']:.2f}s)"
        )
    assert second["compiles"] == 0, "cache hits must replace compilation"


def test_cache_dir_after_xla_work_is_refused(tmp_path: Path) -> None:
    script = (
        "import torch, torch_xla\n"
        "from portable_guided.precompile import precompile\n"
        "(torch.ones(2, device=torch_xla.device()) * 2).cpu()\n"
        f"precompile(max_batch=8, vocab=64, cache_dir={str(tmp_path)!r}, progress=False)\n"
    )
    env = {**os.environ, "PJRT_DEVICE": os.environ.get("PJRT_DEVICE", "CPU")}
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          cwd=REPO, env=env, timeout=300, check=False)
    assert done.returncode != 0
    assert "already ran XLA computations" in done.stderr


def test_report_lists_every_bucket_in_process() -> None:
    report = precompile(max_batch=20, min_bucket=4, vocab=VOCAB, dtype="float32", progress=False)
    assert [b.rows for b in report.buckets] == [4, 8, 16, 20]
    assert report.device.startswith("xla")
    assert report.graphs_compiled == sum(b.graphs_compiled for b in report.buckets)
    table = report.format_table()
    assert all(f"{rows:>7}" in table for rows in (4, 8, 16, 20))
    json.dumps(report.to_dict())


def test_eager_static_platform_runs_without_counts() -> None:
    report = precompile(max_batch=16, vocab=100, dtype="float32", platform="static",
                        device="cpu", progress=False)
    assert [b.rows for b in report.buckets] == [8, 16]
    assert report.graphs_compiled is None and report.cache_files is None


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({"dtype": "int8"}, ValueError, "dtype must be one of float32, bfloat16, float16, got 'int8'"),
        ({"platform": "cpu"}, ValueError, "'cpu' uses"),
        ({"platform": "tpu9"}, ValueError, "tpu9"),
        ({"vocab": 0}, ValueError, "vocab must be a positive int, got 0"),
        ({"max_batch": 0}, ValueError, "max_batch must be >= 1, got 0"),
        ({"platform": "static", "device": "cpu", "cache_dir": "/tmp/x"}, ValueError,
         "cache_dir is only supported on jax, xla"),
    ],
)
def test_bad_arguments(kwargs, error, message) -> None:
    args = {"max_batch": 8, "vocab": 64, "progress": False} | kwargs
    with pytest.raises(error, match=message):
        precompile(**args)


def test_cli_reports_errors_with_status_2() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "portable_guided", "precompile", "--platform", "cpu",
         "--max-batch", "8", "--vocab", "64"],
        capture_output=True, text=True, cwd=REPO, timeout=300, check=False,
    )
    assert done.returncode == 2
    assert "static-shape platforms" in done.stderr
