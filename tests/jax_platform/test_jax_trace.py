"""Static shapes end to end on JAX: after ``precompile(platform="jax")``, a 200-step decode
trace through ``apply_token_mask`` compiles nothing (JAX's own compile events), never copies
the logits to the host, and matches the NumPy reference at every step; the CLI and doctor."""

from __future__ import annotations

import json
import subprocess
import sys
import types

import numpy as np
import pytest

jax = pytest.importorskip("jax")
jnp = pytest.importorskip("jax.numpy")

import portable_guided as pg
from portable_guided.precompile import precompile
from portable_guided.reference import reference_apply_token_mask as reference
from tests.jax_platform.jax_support import count_compiles, random_bitmask

pytestmark = pytest.mark.jax

MAX_BATCH, WIDTH = 64, 300  # 300 columns: 10 words, the last one partly junk


def _trace(steps: int, *, pad: bool, seed: int = 0) -> tuple[list[str], int]:
    """Run ``steps`` decode steps; returns (per-step problems, compilations in total)."""
    policy = pg.BucketPolicy(max_batch=MAX_BATCH)
    rng = np.random.default_rng(seed)
    problems, total = [], 0
    for step in range(steps):
        dtype = ("bfloat16", "float32")[step % 2]
        live = int(rng.integers(1, MAX_BATCH + 1))
        rows = policy.bucket_for(live) if pad else live
        values = rng.standard_normal((rows, WIDTH)).astype(np.float32)
        # The model's logits: already on the device (device_put compiles nothing).
        logits = jax.device_put(values.astype(jnp.dtype(dtype)))
        constrained = rng.permutation(live)[: int(rng.integers(0, live + 1))].tolist()
        bitmask = random_bitmask(rng, live, 10)
        vocab_size = int(rng.integers(WIDTH - 40, WIDTH + 1))
        with count_compiles() as compiles, jax.transfer_guard_device_to_host("disallow"):
            result = pg.apply_token_mask(logits, bitmask, indices=constrained,
                                         vocab_size=vocab_size)
            result.block_until_ready()
        total += len(compiles)
        expected = reference(np.asarray(logits.astype(jnp.float32)), bitmask,
                             indices=constrained, vocab_size=vocab_size)
        wrong = not np.array_equal(np.asarray(result.astype(jnp.float32)), expected)
        if compiles or wrong:
            problems.append(f"step {step} (live {live}, logits rows {rows}, {dtype}, "
                            f"{len(constrained)} constrained): {len(compiles)} compilation(s)"
                            + (", values differ from the reference" if wrong else ""))
    return problems, total


@pytest.fixture(scope="module")
def precompiled():
    reports = [precompile(platform="jax", max_batch=MAX_BATCH, vocab=WIDTH, dtype=dtype,
                          progress=False) for dtype in ("bfloat16", "float32")]
    return reports


def test_precompile_compiles_one_executable_per_bucket(precompiled):
    for report in precompiled:
        assert [b.rows for b in report.buckets] == list(pg.bucket_sizes(MAX_BATCH))
        # Counted from JAX's backend_compile events; fewer would mean a bucket was not
        # compiled here (a test order effect), more a stray compilation.
        assert [b.graphs_compiled for b in report.buckets] == [1] * len(report.buckets), \
            report.format_table()


def test_padded_trace_never_compiles_or_reads_back(precompiled):
    problems, total = _trace(200, pad=True)
    assert total == 0 and problems == [], "\n".join(problems[:20])


def test_unpadded_batch_is_caught():
    """The check can fail: logits of exactly the live batch's rows compile new shapes."""
    problems, total = _trace(12, pad=False, seed=1)
    assert total > 0 and any("compilation" in p for p in problems)


def test_precompile_cli_and_doctor():
    env_python = sys.executable
    out = subprocess.run(
        [env_python, "-m", "portable_guided", "precompile", "--platform", "jax",
         "--max-batch", "16", "--vocab", "1000", "--dtype", "float32", "--json",
         "--no-progress"], capture_output=True, text=True, check=False, timeout=300)
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    assert report["platform"] == "jax" and report["graphs_compiled"] == 2
    doctor = subprocess.run([env_python, "-m", "portable_guided", "doctor", "--batch", "4",
                             "--vocab", "2000"], capture_output=True, text=True, check=False,
                            timeout=300)
    assert doctor.returncode == 0, doctor.stdout + doctor.stderr
    assert f"jax devices ({jax.default_backend()} backend)" in doctor.stdout
    assert "jax       jax:" in doctor.stdout and "FAIL" not in doctor.stdout


def test_persistent_cache_is_written(tmp_path):
    """JAX's persistent compilation cache, through --cache-dir, in a fresh process."""
    cache = tmp_path / "cache"
    out = subprocess.run(
        [sys.executable, "-m", "portable_guided", "precompile", "--platform", "jax",
         "--max-batch", "8", "--vocab", "640", "--cache-dir", str(cache), "--json",
         "--no-progress"], capture_output=True, text=True, check=False, timeout=300)
    assert out.returncode == 0, out.stderr
    first = json.loads(out.stdout)
    assert first["cache_files"] >= 1, first
    again = subprocess.run(
        [sys.executable, "-m", "portable_guided", "precompile", "--platform", "jax",
         "--max-batch", "8", "--vocab", "640", "--cache-dir", str(cache), "--json",
         "--no-progress"], capture_output=True, text=True, check=False, timeout=300)
    second = json.loads(again.stdout)
    assert second["buckets"][0]["stats"]["cache_hits"] == 1, second
    # Loaded, not compiled: JAX's compile timer also fires around a cache load.
    assert second["graphs_compiled"] == 0, second
    assert second["buckets"][0]["stats"]["compiles"] == 0, second


def test_a_second_cache_dir_in_one_process_is_refused(tmp_path):
    """JAX keeps one persistent cache per process: a second directory would silently receive
    nothing (the executables land in the first), so it is an error naming both."""
    code = (
        "import sys\n"
        "from portable_guided.precompile import precompile\n"
        "a, b = sys.argv[1:]\n"
        "precompile(platform='jax', max_batch=8, vocab=64, dtype='float32', cache_dir=a,\n"
        "           progress=False)\n"
        "precompile(platform='jax', max_batch=8, vocab=64, dtype='float32', cache_dir=a,\n"
        "           progress=False)  # the same directory again is fine\n"
        "try:\n"
        "    precompile(platform='jax', max_batch=8, vocab=96, dtype='float32', cache_dir=b,\n"
        "               progress=False)\n"
        "except RuntimeError as exc:\n"
        "    print(exc)\n"
    )
    a, b = tmp_path / "a", tmp_path / "b"
    out = subprocess.run([sys.executable, "-c", code, str(a), str(b)], capture_output=True,
                         text=True, check=False, timeout=300)
    assert out.returncode == 0, out.stderr
    assert f"already {str(a)!r}" in out.stdout and f"cannot use {str(b)!r}" in out.stdout, \
        out.stdout


@pytest.mark.parametrize("device", ["cpu:7", "cpu:x", "nodevice:0"])
def test_precompile_names_a_missing_device(device):
    out = subprocess.run(
        [sys.executable, "-m", "portable_guided", "precompile", "--platform", "jax",
         "--max-batch", "8", "--vocab", "64", "--device", device, "--no-progress"],
        capture_output=True, text=True, check=False, timeout=300)
    assert out.returncode == 2, out.stderr
    assert "Traceback" not in out.stderr and f"{device!r}" in out.stderr, out.stderr


class _NumpyThatRefusesJax(types.ModuleType):
    """NumPy, except that handing it a ``jax.Array`` raises: on the CPU backend a JAX array
    reads into NumPy without any transfer, so JAX's transfer guard cannot see it there."""

    def __init__(self) -> None:
        super().__init__("numpy")

    def __getattr__(self, name):
        value = getattr(np, name)
        if not callable(value) or isinstance(value, type):
            return value

        def checked(*args, **kwargs):
            if any(isinstance(a, jax.Array) for a in (*args, *kwargs.values())):
                raise AssertionError(f"np.{name} was given a jax.Array")
            return value(*args, **kwargs)

        return checked


def test_apply_never_hands_jax_arrays_to_numpy(monkeypatch, precompiled):
    import portable_guided.dlpack
    import portable_guided.kernels.static_common
    import portable_guided.kernels.static_jax
    import portable_guided.validation

    for module in (portable_guided.kernels.static_jax, portable_guided.kernels.static_common,
                   portable_guided.dlpack, portable_guided.validation):
        monkeypatch.setattr(module, "np", _NumpyThatRefusesJax())
    rng = np.random.default_rng(3)
    logits = jax.device_put(rng.standard_normal((16, WIDTH)).astype(np.float32))
    bitmask = random_bitmask(rng, 16, 10)
    with jax.transfer_guard_device_to_host("disallow"):
        result = pg.apply_token_mask(logits, bitmask, indices=[3, 0, 9], vocab_size=290)
    monkeypatch.undo()
    np.testing.assert_array_equal(
        np.asarray(result), reference(np.asarray(logits), bitmask, indices=[3, 0, 9],
                                      vocab_size=290))
    # The spy works: the same NumPy refuses a JAX array.
    with pytest.raises(AssertionError, match="was given a jax.Array"):
        _NumpyThatRefusesJax().asarray(logits)
