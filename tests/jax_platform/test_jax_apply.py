"""``apply_token_mask`` on ``jax.Array`` logits, against the NumPy reference: the registry's
``jax`` platform, a new array returned, the same validation and error contract as every other
framework."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

jax = pytest.importorskip("jax")
jnp = pytest.importorskip("jax.numpy")

import portable_guided as pg
from portable_guided.reference import reference_apply_token_mask as reference
from tests.jax_platform.jax_support import random_bitmask

pytestmark = pytest.mark.jax

DTYPES = ("float32", "bfloat16", "float16")


def _f32(x) -> np.ndarray:
    return np.asarray(x.astype(jnp.float32))


def _logits(rng: np.random.Generator, shape: tuple[int, ...], dtype: str):
    return jnp.asarray(rng.standard_normal(shape).astype(np.float32)).astype(dtype)


def test_import_portable_guided_does_not_import_jax():
    code = ("import sys, portable_guided, portable_guided.cli, portable_guided.platforms.jax\n"
            "portable_guided.get_platform('jax')\n"
            "print('jax' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_jax_arrays_resolve_to_the_jax_platform():
    logits = jnp.zeros((2, 64), jnp.float32)
    resolution = pg.resolve(logits)
    assert resolution.framework == "jax"
    assert resolution.device_type == f"jax:{jax.devices()[0].platform}"
    assert resolution.platform.name == "jax"
    assert resolution.platform.in_place is False and resolution.platform.static_shapes
    # A NumPy array of the same values still goes to the cpu platform.
    assert pg.resolve(np.zeros((2, 64), np.float32)).platform.name == "cpu"


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(
    ("rows", "width", "indices", "vocab_size"),
    [(4, 1000, None, None), (4, 1000, [0, 2, 3], 997), (8, 4099, [7, 1], None),
     (3, 64, [], None), (1, 33, None, 1)],
    ids=["all-rows", "rows+vocab", "unsorted-rows", "no-rows", "tail-word"],
)
def test_apply_matches_reference_and_returns_a_new_array(dtype, rows, width, indices, vocab_size):
    rng = np.random.default_rng([rows, width, len(dtype)])
    logits = _logits(rng, (rows, width), dtype)
    bitmask = random_bitmask(rng, rows, -(-width // 32))
    before = _f32(logits)
    expected = reference(before, bitmask, indices=indices, vocab_size=vocab_size)

    result = pg.apply_token_mask(logits, bitmask, indices=indices, vocab_size=vocab_size)

    assert isinstance(result, jax.Array) and result.dtype == logits.dtype
    np.testing.assert_array_equal(_f32(logits), before)  # the input is unchanged
    np.testing.assert_array_equal(_f32(result), expected)


@pytest.mark.parametrize("kind", ["list", "numpy", "jax"])
def test_indices_as_list_numpy_or_jax(kind):
    rng = np.random.default_rng(7)
    logits = _logits(rng, (6, 200), "float32")
    bitmask = random_bitmask(rng, 5, 7)  # fewer bitmask rows than logits rows
    rows = [4, 0, 2]
    indices = {"list": rows, "numpy": np.array(rows), "jax": jnp.array(rows)}[kind]
    result = pg.apply_token_mask(logits, bitmask, indices=indices)
    np.testing.assert_array_equal(_f32(result), reference(_f32(logits), bitmask, indices=rows))


@pytest.mark.parametrize("dtype", DTYPES)
def test_bitmask_already_on_the_device(dtype):
    rng = np.random.default_rng(3)
    logits = _logits(rng, (5, 300), dtype)
    bitmask = random_bitmask(rng, 5, 10)
    expected = reference(_f32(logits), bitmask, indices=[1, 4], vocab_size=290)
    result = pg.apply_token_mask(logits, jnp.asarray(bitmask), indices=[1, 4], vocab_size=290)
    np.testing.assert_array_equal(_f32(result), expected)


def test_junk_bits_beyond_the_vocabulary_are_ignored():
    """Bits past ``vocab_size`` (and past the logits' width) are garbage in real bitmasks: the
    padded columns must keep their values whatever those bits say."""
    rng = np.random.default_rng(11)
    logits = _logits(rng, (3, 100), "float32")  # 100 columns: 4 words, 28 junk bits
    bitmask = np.zeros((3, 4), np.int32)  # everything blocked...
    bitmask[:, 3] = np.int32(-1) << 2  # ...except junk: tokens 98, 99 and bits past 100
    result = _f32(pg.apply_token_mask(logits, bitmask, vocab_size=98))
    expected = reference(_f32(logits), bitmask, vocab_size=98)
    np.testing.assert_array_equal(result, expected)
    assert np.isinf(result[:, :98]).all() and np.isfinite(result[:, 98:]).all()


def test_bit_31_of_negative_words():
    """Bit 31 is the sign bit of an int32 word: an arithmetic shift would smear it."""
    logits = jnp.zeros((1, 64), jnp.float32)
    bitmask = np.array([[np.int32(-(2**31)), 1]], np.int32)  # tokens 31 and 32 only
    result = _f32(pg.apply_token_mask(logits, bitmask))
    assert np.flatnonzero(np.isfinite(result[0])).tolist() == [31, 32]


def test_one_dimensional_logits():
    rng = np.random.default_rng(5)
    logits = _logits(rng, (130,), "bfloat16")
    bitmask = random_bitmask(rng, 1, 5)[0]
    result = pg.apply_token_mask(logits, bitmask)
    assert result.shape == (130,)
    np.testing.assert_array_equal(_f32(result), reference(_f32(logits), bitmask))


def test_narrow_bitmask_warns_and_leaves_the_rest():
    rng = np.random.default_rng(2)
    logits = _logits(rng, (2, 100), "float32")
    bitmask = random_bitmask(rng, 2, 2)  # covers 64 of 100 columns
    with pytest.warns(UserWarning, match="covers only 64 tokens"):
        result = pg.apply_token_mask(logits, bitmask)
    np.testing.assert_array_equal(_f32(result), reference(_f32(logits), bitmask))
    np.testing.assert_array_equal(_f32(result)[:, 64:], _f32(logits)[:, 64:])


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({"indices": [0, 4]}, ValueError, r"indices \[4\] out of range \[0, 3\)"),
        ({"indices": [1, 1]}, ValueError, r"duplicates \[1\]"),
        ({"indices": [True]}, TypeError, "bool"),
        ({"indices": jnp.array([0.5])}, TypeError, "integer dtype"),
        ({"vocab_size": 200}, ValueError, r"vocab_size 200 must be in \[0, 96\]"),
        ({"bitmask": np.zeros((3, 3), np.int64)}, TypeError, "bitmask must be int32, got int64"),
        ({"bitmask": np.zeros((2, 3), np.int32)}, ValueError, "2 bitmask rows for 3 logits rows"),
        ({"logits": jnp.zeros((3, 96), jnp.int32)}, TypeError, "got int32"),
        ({"logits": jnp.zeros((1, 3, 96))}, ValueError, "1-D or 2-D, got 3-D"),
    ],
)
def test_bad_input_raises_naming_the_values(kwargs, error, message):
    args = {"logits": jnp.ones((3, 96), jnp.float32), "bitmask": np.zeros((3, 3), np.int32)}
    args.update(kwargs)
    logits, bitmask = args.pop("logits"), args.pop("bitmask")
    with pytest.raises(error, match=message):
        pg.apply_token_mask(logits, bitmask, **args)


def test_inside_jit_the_error_points_at_mask_logits():
    @jax.jit
    def step(logits):
        return pg.apply_token_mask(logits, np.zeros((2, 2), np.int32))

    with pytest.raises(TypeError, match="call portable_guided.jax.mask_logits inside jit"):
        step(jnp.zeros((2, 64)))


def test_multi_device_logits_are_refused_with_the_way_out():
    """Two CPU devices exist only when XLA is told so before JAX starts: a fresh process."""
    code = (
        "import numpy as np, jax, jax.numpy as jnp, portable_guided as pg\n"
        "mesh = jax.sharding.Mesh(np.array(jax.devices()[:2]), ('b',))\n"
        "spec = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec('b'))\n"
        "logits = jax.device_put(jnp.zeros((4, 64)), spec)\n"
        "try:\n"
        "    pg.apply_token_mask(logits, np.zeros((4, 2), np.int32))\n"
        "except ValueError as exc:\n"
        "    print(exc)\n"
    )
    env = {**os.environ, "XLA_FLAGS": "--xla_force_host_platform_device_count=2",
           "JAX_PLATFORMS": "cpu"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=False, env=env, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "these span 2" in out.stdout and "mask_logits inside your jit" in out.stdout, out.stdout
