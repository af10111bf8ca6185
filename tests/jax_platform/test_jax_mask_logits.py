"""``portable_guided.jax.mask_logits``, the pure function an engine calls inside its own jitted
sampler: parity with the NumPy reference under jit, explicit row mapping (shuffled and padded
batches, the tpu-inference #1531 failure mode), donation, no host transfer, a greedy step."""

from __future__ import annotations

import numpy as np
import pytest

jax = pytest.importorskip("jax")
jnp = pytest.importorskip("jax.numpy")
hypothesis = pytest.importorskip("hypothesis")

from hypothesis import given, settings
from hypothesis import strategies as st

import portable_guided.jax as pgj
from portable_guided import BucketPolicy
from portable_guided.reference import reference_apply_token_mask as reference
from tests.jax_platform.jax_support import count_compiles, random_bitmask, xla_owned

pytestmark = pytest.mark.jax

DTYPES = ("float32", "bfloat16", "float16")


def _f32(x) -> np.ndarray:
    return np.asarray(x.astype(jnp.float32))


def _expected(values: np.ndarray, bitmask: np.ndarray, rows_of: list[int],
              vocab_size: int | None = None) -> np.ndarray:
    """The reference, row by row: bitmask row i masks logits row rows_of[i]; rows_of entries
    outside the batch mask nothing."""
    out = values.copy()
    for i, row in enumerate(rows_of):
        if 0 <= row < values.shape[0]:
            out[row] = reference(values[row], bitmask[i], vocab_size=vocab_size)
    return out


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(("width", "words", "vocab_size"),
                         [(1000, 32, None), (1000, 32, 997), (4099, 129, None), (96, 3, 64)])
def test_jitted_matches_reference(dtype, width, words, vocab_size):
    rng = np.random.default_rng([width, words, len(dtype)])
    values = rng.standard_normal((8, width)).astype(np.float32)
    logits = jnp.asarray(values).astype(dtype)
    bitmask = random_bitmask(rng, 8, words)
    masked = jax.jit(pgj.mask_logits, static_argnames="vocab_size")(
        logits, jnp.asarray(bitmask), vocab_size=vocab_size)
    assert masked.dtype == logits.dtype and masked.shape == logits.shape
    np.testing.assert_array_equal(_f32(masked),
                                  reference(_f32(logits), bitmask, vocab_size=vocab_size))


def test_uint32_bitmask_and_bit_31():
    logits = jnp.zeros((2, 64), jnp.float32)
    words = np.array([[1 << 31, 1], [0xFFFFFFFF, 0]], np.uint32)
    got = np.isfinite(_f32(jax.jit(pgj.mask_logits)(logits, jnp.asarray(words))))
    assert np.flatnonzero(got[0]).tolist() == [31, 32]
    assert np.flatnonzero(got[1]).tolist() == list(range(32))
    # Same words as int32: identical result.
    same = jax.jit(pgj.mask_logits)(logits, jnp.asarray(words.view(np.int32)))
    np.testing.assert_array_equal(np.isfinite(_f32(same)), got)


@pytest.mark.parametrize("dtype", DTYPES)
def test_allowed_entries_keep_their_bit_patterns(dtype):
    """The integer blend keeps allowed NaN, -0.0, +-inf and subnormals bit for bit, and
    writes exactly -inf's bit pattern at blocked ones (compared as bits, not as floats)."""
    special = np.array([np.nan, -0.0, 0.0, np.inf, -np.inf, 1e-40, -1e-40, 3.5], np.float32)
    values = np.tile(special, 12)[None].repeat(3, axis=0)  # 96 columns: 3 words
    bitmask = np.array([[-1, -1, -1], [0, 0, 0], [0x55555555, -0x55555556, -(2**31)]],
                       np.int32)
    logits = jnp.asarray(values).astype(dtype)
    got = jax.jit(pgj.mask_logits)(logits, jnp.asarray(bitmask))
    itype = np.int32 if dtype == "float32" else np.int16
    got_bits = np.asarray(jax.lax.bitcast_convert_type(got, itype))
    in_bits = np.asarray(jax.lax.bitcast_convert_type(logits, itype))
    neg = np.asarray(jax.lax.bitcast_convert_type(jnp.array(-np.inf, dtype), itype))
    allowed = np.unpackbits(bitmask.view(np.uint8), axis=1, bitorder="little").astype(bool)
    np.testing.assert_array_equal(got_bits, np.where(allowed, in_bits, neg))


def test_narrow_bitmask_leaves_uncovered_columns_and_warns_at_trace():
    rng = np.random.default_rng(1)
    values = rng.standard_normal((3, 150)).astype(np.float32)
    bitmask = random_bitmask(rng, 3, 2)  # 64 of 150 columns
    with pytest.warns(UserWarning, match="covers only 64 tokens"):
        masked = jax.jit(pgj.mask_logits)(jnp.asarray(values), jnp.asarray(bitmask))
    np.testing.assert_array_equal(_f32(masked), reference(values, bitmask))


@settings(max_examples=40, deadline=None)
@given(data=st.data())
def test_shuffled_and_padded_rows_never_misalign(data):
    """Any permutation of requests over logits rows, any padding: each bitmask row lands on
    exactly the logits row its index names (one graph: shapes fixed by the bucket)."""
    batch, bucket, width = 16, 8, 200
    live = data.draw(st.integers(0, bucket), label="constrained rows")
    rows_of = data.draw(st.permutations(range(batch)), label="order")[:live]
    seed = data.draw(st.integers(0, 2**32 - 1), label="seed")
    rng = np.random.default_rng(seed)
    values = rng.standard_normal((batch, width)).astype(np.float32)
    bitmask = random_bitmask(rng, live, 7) if live else np.zeros((0, 7), np.int32)
    device_mask, device_rows = pgj.device_bitmask(
        bitmask, rows_of, logits_rows=batch, policy=BucketPolicy(max_batch=bucket))
    assert device_mask.shape == (bucket, 7) and device_rows.shape == (bucket,)
    masked = _masked_jit(jnp.asarray(values), device_mask, device_rows)
    np.testing.assert_array_equal(_f32(masked), _expected(values, bitmask, list(rows_of)))


_masked_jit = jax.jit(pgj.mask_logits)


def test_out_of_range_and_negative_indices_mask_nothing():
    rng = np.random.default_rng(4)
    values = rng.standard_normal((4, 64)).astype(np.float32)
    bitmask = np.zeros((4, 2), np.int32)  # every row blocks everything
    rows = jnp.array([2, -1, 4, -7], jnp.int32)  # only row 2 is a real target
    masked = _f32(jax.jit(pgj.mask_logits)(jnp.asarray(values), jnp.asarray(bitmask), rows))
    assert np.isinf(masked[2]).all()
    np.testing.assert_array_equal(np.delete(masked, 2, axis=0), np.delete(values, 2, axis=0))


def test_sorted_request_ids_bug_of_tpu_inference_1531():
    """tpu-inference #1531: the grammar bitmask rows came in sorted request-id order while the
    logits rows were in batch order, and rows were matched by position, so under concurrency a
    request was masked with another request's grammar. With explicit indices the order in
    which the bitmask rows were filled does not matter."""
    batch_order = ["req-7", "req-10", "req-3", "req-12"]  # logits rows, scheduler order
    row_of = {req: i for i, req in enumerate(batch_order)}
    constrained = sorted(["req-7", "req-10", "req-3"])  # bitmask filled in sorted order
    width = 64
    # Each request allows a single token of its own, so a misplaced row shows.
    allowed = {"req-7": 7, "req-10": 10, "req-3": 3}
    bitmask = np.zeros((len(constrained), 2), np.int32)
    for i, req in enumerate(constrained):
        bitmask[i, allowed[req] // 32] = 1 << (allowed[req] % 32)
    logits = jnp.zeros((len(batch_order), width), jnp.float32)

    # The failure mode: positions in the sorted list taken as logits rows.
    positional = _f32(jax.jit(pgj.mask_logits)(
        logits, jnp.asarray(bitmask), jnp.arange(len(constrained), dtype=jnp.int32)))
    assert np.argmax(positional[row_of["req-7"]]) != allowed["req-7"]

    # Explicit indices: each bitmask row names its request's logits row.
    mask_dev, rows_dev = pgj.device_bitmask(
        bitmask, [row_of[req] for req in constrained], logits_rows=len(batch_order))
    masked = _f32(jax.jit(pgj.mask_logits)(logits, mask_dev, rows_dev))
    for req in constrained:
        finite = np.flatnonzero(np.isfinite(masked[row_of[req]])).tolist()
        assert finite == [allowed[req]], (req, finite)
    assert np.isfinite(masked[row_of["req-12"]]).all()  # unconstrained request untouched


def test_device_bitmask_refuses_ambiguous_rows():
    bitmask = np.zeros((2, 3), np.int32)
    with pytest.raises(ValueError, match=r"duplicates \[1\]"):
        pgj.device_bitmask(bitmask, [1, 1], logits_rows=4)
    with pytest.raises(ValueError, match=r"indices \[4\] out of range \[0, 4\)"):
        pgj.device_bitmask(bitmask, [0, 4], logits_rows=4)
    with pytest.raises(ValueError, match="one entry per bitmask row"):
        pgj.device_bitmask(bitmask, [0], logits_rows=4)
    with pytest.raises(TypeError, match="2-D int32"):
        pgj.device_bitmask(bitmask.astype(np.int64), [0, 1], logits_rows=4)


def test_trace_time_errors_name_the_values():
    logits, bitmask = jnp.zeros((4, 64)), jnp.zeros((3, 2), jnp.int32)
    with pytest.raises(ValueError, match="got 3 bitmask rows for 4 logits rows"):
        jax.jit(pgj.mask_logits)(logits, bitmask)
    with pytest.raises(ValueError, match=r"shape \(3,\)"):
        jax.jit(pgj.mask_logits)(logits, bitmask, jnp.zeros(2, jnp.int32))
    with pytest.raises(ValueError, match=r"vocab_size 65 must be in \[0, 64\]"):
        pgj.mask_logits(logits, jnp.zeros((4, 2), jnp.int32), vocab_size=65)
    with pytest.raises(TypeError, match="bitmask must be int32"):
        pgj.mask_logits(logits, jnp.zeros((4, 2), jnp.float32))


def test_donated_logits_buffer_is_reused():
    """Donated inside jit, the masked logits are written into the input's buffer: no new
    allocation of the logits' size per step."""
    rng = np.random.default_rng(9)
    values = rng.standard_normal((8, 4096)).astype(np.float32)
    bitmask = jnp.asarray(random_bitmask(rng, 8, 128))
    step = jax.jit(pgj.mask_logits, donate_argnums=0)
    logits = xla_owned(values, "float32")
    pointer = logits.unsafe_buffer_pointer()
    masked = step(logits, bitmask)
    assert logits.is_deleted()
    assert masked.unsafe_buffer_pointer() == pointer
    np.testing.assert_array_equal(_f32(masked), reference(values, np.asarray(bitmask)))


def test_no_device_to_host_transfer_inside_the_sampler():
    rng = np.random.default_rng(8)
    values = rng.standard_normal((8, 500)).astype(np.float32)
    mask_dev, rows_dev = pgj.device_bitmask(random_bitmask(rng, 3, 16), [5, 0, 6],
                                            logits_rows=8)
    logits = xla_owned(values, "bfloat16")
    sampler = jax.jit(lambda x, m, r: jnp.argmax(pgj.mask_logits(x, m, r), axis=-1))
    sampler(logits, mask_dev, rows_dev).block_until_ready()  # compile outside the guard
    with jax.transfer_guard("disallow"):
        tokens = sampler(logits, mask_dev, rows_dev)
    assert tokens.shape == (8,)


@jax.jit
def _greedy_step(hidden, weights, bitmask, rows):
    """A stand-in model + sampler: lm_head, mask, argmax, all in one jitted step."""
    logits = (hidden @ weights).astype(jnp.bfloat16)
    masked = pgj.mask_logits(logits, bitmask, rows, vocab_size=weights.shape[1] - 5)
    return jnp.argmax(masked, axis=-1), masked, logits


def test_mask_logits_inside_a_jitted_greedy_step():
    rng = np.random.default_rng(12)
    batch, hidden_size, vocab = 8, 32, 1003
    weights = jnp.asarray(rng.standard_normal((hidden_size, vocab)).astype(np.float32))
    policy = BucketPolicy(max_batch=8, min_bucket=4)
    compiles_per_step = []
    for step in range(6):
        hidden = xla_owned(rng.standard_normal((batch, hidden_size)), "float32")
        live = [4, 1, 3, 2, 4, 1][step]
        rows_of = rng.permutation(batch)[:live].tolist()
        bitmask = random_bitmask(rng, live, -(-vocab // 32))
        mask_dev, rows_dev = pgj.device_bitmask(bitmask, rows_of, logits_rows=batch,
                                                policy=policy)
        with count_compiles() as compiles:
            tokens, masked, logits = _greedy_step(hidden, weights, mask_dev, rows_dev)
        compiles_per_step.append(len(compiles))
        expected = _expected(_f32(logits), bitmask, rows_of, vocab_size=vocab - 5)
        np.testing.assert_array_equal(_f32(masked), expected)
        np.testing.assert_array_equal(np.asarray(tokens), np.argmax(expected, axis=-1))
        for i, row in enumerate(rows_of):  # every constrained row samples an allowed token
            token = int(tokens[row])
            assert token >= vocab - 5 or (int(bitmask[i, token // 32]) >> (token % 32)) & 1
    # Bitmask rows padded to buckets of 4 (live 1-4): one compilation, at the first step.
    assert compiles_per_step == [1, 0, 0, 0, 0, 0], compiles_per_step


def test_64_bit_indices_are_range_checked_before_narrowing():
    """Eagerly, NumPy int64 indices reach mask_logits as int64: 2**32 + 1 is out of range
    and masks nothing (narrowed first, it would be row 1)."""
    logits = jnp.zeros((2, 64), jnp.float32)
    got = pgj.mask_logits(logits, jnp.zeros((1, 2), jnp.int32), np.array([2**32 + 1]))
    np.testing.assert_array_equal(_f32(got), _f32(logits))


@pytest.mark.parametrize("name", ["logits", "bitmask", "indices"])
def test_non_arrays_are_a_type_error_naming_the_argument(name):
    args = {"logits": jnp.zeros((2, 64), jnp.float32), "bitmask": jnp.zeros((2, 2), jnp.int32),
            "indices": jnp.array([1, 0])}
    args[name] = np.asarray(args[name]).tolist()
    with pytest.raises(TypeError, match=f"{name} must be a jax.Array .* got list"):
        pgj.mask_logits(**args)


def test_narrow_bitmask_warning_points_at_the_caller_for_1d_logits():
    for shape, words in (((100,), (2,)), ((1, 100), (1, 2))):
        with pytest.warns(UserWarning, match="covers only 64 tokens") as caught:
            pgj.mask_logits(jnp.zeros(shape, jnp.float32), jnp.zeros(words, jnp.int32))
        assert caught[0].filename == __file__, (shape, caught[0].filename)


def test_device_bitmask_names_python_ints_past_int64_as_out_of_range():
    with pytest.raises(ValueError, match=r"indices \[1180591620717411303424\] out of range"):
        pgj.device_bitmask(np.zeros((2, 2), np.int32), [2**70, 0], logits_rows=2)
