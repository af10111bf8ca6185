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


def _on_two_cpu_devices(code: str) -> str:
    """Run ``code`` in a fresh Python with two CPU devices (XLA must be told before JAX
    starts); returns what it printed."""
    env = {**os.environ, "XLA_FLAGS": "--xla_force_host_platform_device_count=2",
           "JAX_PLATFORMS": "cpu"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=False, env=env, timeout=120)
    assert out.returncode == 0, out.stderr
    return out.stdout


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
    out = _on_two_cpu_devices(code)
    assert "these span 2" in out and "mask_logits inside your jit" in out, out


def test_nothing_to_mask_still_returns_a_new_array():
    """A caller may donate the result and keep the input: even with no row or column to mask
    the result is not the input object."""
    logits = jnp.arange(128, dtype=jnp.float32).reshape(2, 64)
    bitmask = np.zeros((2, 2), np.int32)
    for kwargs in ({"indices": []}, {"vocab_size": 0}):
        result = pg.apply_token_mask(logits, bitmask, **kwargs)
        assert result is not logits
        np.testing.assert_array_equal(_f32(result), _f32(logits))
        jax.jit(lambda x: x + 1, donate_argnums=0)(result)
        assert not logits.is_deleted()


def test_device_bitmask_compiles_once_for_every_vocab_size():
    """``vocab_size`` is data for a bitmask on the device: one graph per shape."""
    from tests.jax_platform.jax_support import count_compiles

    rng = np.random.default_rng(4)
    logits = _logits(rng, (3, 130), "float32")
    host = random_bitmask(rng, 3, 5)
    bitmask = jnp.asarray(host)
    pg.apply_token_mask(logits, bitmask, vocab_size=129)  # first use of this shape compiles
    with count_compiles() as compiles:
        for vocab_size in (0, 1, 31, 32, 33, 100, 128, 130, None):
            result = pg.apply_token_mask(logits, bitmask, vocab_size=vocab_size)
            np.testing.assert_array_equal(
                _f32(result), reference(_f32(logits), host, vocab_size=vocab_size))
    assert compiles == []


def test_a_jax_bitmask_for_numpy_logits_is_refused_with_the_way_out():
    with pytest.raises(ValueError, match=r"a JAX bitmask must be on the logits' device \(cpu\), "
                                         r"got one on jax:cpu; pass a NumPy array"):
        pg.apply_token_mask(np.zeros((2, 64), np.float32), jnp.zeros((2, 2), jnp.int32))


def test_a_bitmask_on_another_device_is_refused_naming_both():
    code = (
        "import numpy as np, jax, jax.numpy as jnp, portable_guided as pg\n"
        "d0, d1 = jax.devices()[:2]\n"
        "logits = jax.device_put(jnp.zeros((2, 64)), d0)\n"
        "try:\n"
        "    pg.apply_token_mask(logits, jax.device_put(np.zeros((2, 2), np.int32), d1))\n"
        "except ValueError as exc:\n"
        "    print(exc)\n"
    )
    out = _on_two_cpu_devices(code)
    assert "the bitmask is on ['cpu:1'] and the logits on cpu:0" in out, out


def test_64_bit_indices_with_x64_enabled():
    """With JAX's 64-bit types on: uint64 indices past int64 are out of range (not an
    OverflowError), and int64 indices past int32 mask nothing in mask_logits (not row
    ``index % 2**32``)."""
    code = (
        "import numpy as np, jax, jax.numpy as jnp, portable_guided as pg\n"
        "import portable_guided.jax as pgj\n"
        "try:\n"
        "    pg.apply_token_mask(jnp.zeros((2, 64), jnp.float32), np.zeros((2, 2), np.int32),\n"
        "                        indices=jnp.array([2**63], jnp.uint64))\n"
        "except ValueError as exc:\n"
        "    print(exc)\n"
        "out = jax.jit(pgj.mask_logits)(jnp.zeros((2, 64), jnp.float32),\n"
        "                               jnp.zeros((1, 2), jnp.int32),\n"
        "                               jnp.array([2**32 + 1], jnp.int64))\n"
        "print('masked rows', np.flatnonzero(np.isinf(np.asarray(out)).any(axis=1)).tolist())\n"
    )
    env = {**os.environ, "JAX_ENABLE_X64": "1", "JAX_PLATFORMS": "cpu"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=False, env=env, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "indices [9223372036854775808] out of range [0, 2)" in out.stdout, out.stdout
    assert "masked rows []" in out.stdout, out.stdout
