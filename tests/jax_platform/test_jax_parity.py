"""Both JAX paths against the NumPy reference and against the CPU kernel, property-based.

The same random cases as ``tests/test_parity.py`` (shapes, one-dimensional logits, bitmasks
narrower or wider than the vocabulary, junk bits, indices as a list, NumPy or JAX array,
``vocab_size``), through ``apply_token_mask`` on a ``jax.Array`` (eager) and through
``device_bitmask`` + ``mask_logits`` under ``jit``. Where the CPU kernel serves the dtype, the
same call on NumPy logits must give the same values: two implementations checked against
each other as well as against the reference.
"""

from __future__ import annotations

import functools
import warnings

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

jax = pytest.importorskip("jax")
jnp = pytest.importorskip("jax.numpy")

import portable_guided as pg
import portable_guided.jax as pgj
from portable_guided.reference import reference_apply_token_mask as reference

pytestmark = pytest.mark.jax

BITMASK_KINDS = ("random", "sparse", "all-allowed", "all-blocked")


def _bitmask(rng: np.random.Generator, kind: str, rows: int, words: int) -> np.ndarray:
    if kind == "all-allowed":
        return np.full((rows, words), -1, np.int32)
    if kind == "all-blocked":
        return np.zeros((rows, words), np.int32)
    random = rng.integers(-(2**31), 2**31, (rows, words), dtype=np.int64).astype(np.int32)
    if kind == "random":
        return random
    return np.where(rng.random((rows, words)) < 0.1, random, 0).astype(np.int32)


@st.composite
def cases(draw):
    batch = draw(st.integers(1, 6))
    width = draw(st.integers(1, 300))
    one_d = batch == 1 and draw(st.booleans())
    words = max(1, -(-width // 32) + draw(st.integers(-1, 1)))  # narrower, exact or wider
    with_indices = not one_d and draw(st.booleans())
    bitmask_rows = draw(st.integers(1, batch + 2)) if with_indices else batch
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    bitmask = _bitmask(rng, draw(st.sampled_from(BITMASK_KINDS)), bitmask_rows, words)
    indices = None
    if with_indices:
        limit = min(batch, bitmask_rows)
        indices = draw(st.lists(st.integers(0, limit - 1), unique=True, max_size=limit))
    covered = min(width, 32 * words)
    return {
        "values": rng.standard_normal((batch, width)).astype(np.float32),
        "one_d": one_d,
        "dtype": draw(st.sampled_from(["float32", "bfloat16", "float16"])),
        "bitmask": bitmask,
        "bitmask_kind": draw(st.sampled_from(["numpy", "jax"])),
        "indices": indices,
        "indices_kind": draw(st.sampled_from(["list", "numpy", "jax"])),
        "vocab_size": draw(st.one_of(st.none(), st.integers(0, covered))),
    }


def _f32(x) -> np.ndarray:
    return np.asarray(jnp.asarray(x).astype(jnp.float32))


def _as(kind: str, array: np.ndarray):
    return jnp.asarray(array) if kind == "jax" else array


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=cases())
def test_apply_token_mask_matches_reference_and_the_cpu_kernel(case):
    values = case["values"][0] if case["one_d"] else case["values"]
    bitmask = case["bitmask"][0] if case["one_d"] else case["bitmask"]
    indices = case["indices"]
    if indices is not None and case["indices_kind"] != "list":
        indices = _as(case["indices_kind"], np.asarray(indices, np.int64))
    logits = jnp.asarray(values).astype(case["dtype"])
    before = _f32(logits)
    expected = reference(before, bitmask, indices=case["indices"],
                         vocab_size=case["vocab_size"])

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # a narrower bitmask warns (tested elsewhere)
        result = pg.apply_token_mask(logits, _as(case["bitmask_kind"], bitmask),
                                     indices=indices, vocab_size=case["vocab_size"])
        if case["dtype"] != "bfloat16":  # NumPy has no bfloat16
            on_cpu = np.array(before, dtype=case["dtype"])
            pg.apply_token_mask(on_cpu, bitmask, indices=case["indices"],
                                vocab_size=case["vocab_size"])

    assert result.dtype == logits.dtype and result.shape == logits.shape
    np.testing.assert_array_equal(_f32(logits), before)  # the input is unchanged
    np.testing.assert_array_equal(_f32(result), expected)
    if case["dtype"] != "bfloat16":
        np.testing.assert_array_equal(_f32(result), on_cpu.astype(np.float32))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=cases(), min_bucket=st.sampled_from([1, 2, 4, 8]))
def test_mask_logits_under_jit_matches_reference(case, min_bucket):
    """``device_bitmask`` (rows padded to a bucket, explicit row indices) then ``mask_logits``
    in a jitted function: bitmask row ``i`` masks logits row ``indices[i]``."""
    values = case["values"]
    batch = values.shape[0]
    rows_of = list(range(batch)) if case["indices"] is None else case["indices"]
    host_mask = case["bitmask"][rows_of]  # one bitmask row per masked logits row
    logits = jnp.asarray(values).astype(case["dtype"])
    before = _f32(logits)
    expected = reference(before, case["bitmask"], indices=case["indices"],
                         vocab_size=case["vocab_size"])
    policy = pg.BucketPolicy(max_batch=8, min_bucket=min_bucket)
    mask_dev, rows_dev = pgj.device_bitmask(host_mask, rows_of, logits_rows=batch,
                                            policy=policy)
    apply = jax.jit(functools.partial(pgj.mask_logits, vocab_size=case["vocab_size"]))

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # a narrower bitmask warns at trace time
        result = apply(logits, mask_dev, rows_dev)

    assert mask_dev.shape[0] == policy.bucket_for(max(len(rows_of), 1))
    np.testing.assert_array_equal(_f32(result), expected)
