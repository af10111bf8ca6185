"""The error contract: bad input raises naming the values and leaves the logits untouched."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

import portable_guided as pg
from tests.support import HAS_TORCH, framework_params, make, to_f32

CASES = [
    # (description, logits shape, logits dtype, bitmask shape, bitmask dtype, kwargs, error, text)
    ("3-D logits", (2, 3, 40), "float32", (2, 2), "int32", {}, ValueError, "3-D"),
    ("int logits", (2, 40), "int32", (2, 2), "int32", {}, TypeError, "int32"),
    ("float64 logits", (2, 40), "float64", (2, 2), "int32", {}, TypeError, "float64"),
    ("int64 bitmask", (2, 40), "float32", (2, 2), "int64", {}, TypeError, "int64"),
    ("3-D bitmask", (2, 40), "float32", (2, 2, 1), "int32", {}, ValueError, "3-D"),
    ("row mismatch", (3, 40), "float32", (2, 2), "int32", {}, ValueError, "2 bitmask rows for 3"),
    ("index too big", (3, 40), "float32", (2, 2), "int32", {"indices": [0, 2]}, ValueError,
     r"\[2\] out of range \[0, 2\)"),
    ("negative index", (3, 40), "float32", (3, 2), "int32", {"indices": [-1]}, ValueError,
     r"\[-1\]"),
    ("duplicate index", (3, 40), "float32", (3, 2), "int32", {"indices": [1, 0, 1]}, ValueError,
     r"duplicates \[1\]"),
    ("float indices", (3, 40), "float32", (3, 2), "int32", {"indices": [0.5]}, TypeError, "float"),
    ("2-D index array", (3, 40), "float32", (3, 2), "int32",
     {"indices": np.zeros((1, 1), np.int64)}, ValueError, r"\(1, 1\)"),
    ("vocab wider than bitmask", (2, 100), "float32", (2, 2), "int32", {"vocab_size": 65},
     ValueError, "vocab_size 65"),
    ("vocab wider than logits", (2, 40), "float32", (2, 2), "int32", {"vocab_size": 41},
     ValueError, "vocab_size 41"),
    ("negative vocab", (2, 40), "float32", (2, 2), "int32", {"vocab_size": -1}, ValueError, "-1"),
    ("float vocab", (2, 40), "float32", (2, 2), "int32", {"vocab_size": 3.0}, TypeError, "float"),
    ("unknown platform", (2, 40), "float32", (2, 2), "int32", {"platform": "tpu9"}, ValueError,
     "unknown platform 'tpu9'; available: cpu, cuda, jax, npu, static, xla, xpu"),
    # bool is an int subclass: [True, False] must not mean rows 1 and 0.
    ("bool indices", (2, 40), "float32", (2, 2), "int32", {"indices": [True, False]},
     TypeError, r"got a bool \(True\)"),
    ("bool index array", (2, 40), "float32", (2, 2), "int32",
     {"indices": np.array([True, False])}, TypeError, "integer dtype, got bool"),
    ("index beyond int64", (2, 40), "float32", (2, 2), "int32", {"indices": [2**70]},
     ValueError, r"\[1180591620717411303424\] out of range \[0, 2\)"),
]


@pytest.mark.parametrize("framework", framework_params())
@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_bad_input_raises_and_leaves_logits_untouched(framework, case):
    _, shape, dtype, bitmask_shape, bitmask_dtype, kwargs, error, text = case
    rng = np.random.default_rng(0)
    values = rng.standard_normal(shape).astype(dtype) if "float" in dtype else np.ones(shape, dtype)
    logits = make(values, framework)
    bitmask = make(np.zeros(bitmask_shape, bitmask_dtype), framework)
    before = np.array(to_f32(logits) if "float" in dtype else values, copy=True)
    with pytest.raises(error, match=text):
        pg.apply_token_mask(logits, bitmask, **kwargs)
    after = to_f32(logits) if "float" in dtype else values
    np.testing.assert_array_equal(after, before)


def test_platform_without_a_kernel_for_the_framework():
    logits = np.zeros((1, 8), np.float32)
    with pytest.raises(ValueError, match="'xla' has no kernel for numpy logits; it serves: torch"):
        pg.apply_token_mask(logits, np.zeros((1, 1), np.int32), platform="xla")


def test_non_tensors_are_rejected_with_their_type():
    with pytest.raises(TypeError, match="list"):
        pg.apply_token_mask([0.0, 1.0], np.zeros(1, np.int32))
    with pytest.raises(TypeError, match="bitmask.*list"):
        pg.apply_token_mask(np.zeros(4, np.float32), [0])


def test_unknown_platform_from_environment(monkeypatch):
    monkeypatch.setenv(pg.ENV_VAR, "nope")
    logits = np.zeros((1, 8), np.float32)
    with pytest.raises(ValueError, match="PORTABLE_GUIDED_PLATFORM='nope'.*available: cpu"):
        pg.apply_token_mask(logits, np.zeros((1, 1), np.int32))
    assert not np.isinf(logits).any()


def test_narrow_bitmask_warns_and_masks_only_covered_columns():
    logits = np.zeros((1, 40), np.float32)
    with pytest.warns(UserWarning, match="covers only 32 tokens but logits have 40") as record:
        pg.apply_token_mask(logits, np.zeros((1, 1), np.int32))
    assert record[0].filename == __file__  # stacklevel points at the caller
    assert np.isinf(logits[0, :32]).all() and not np.isinf(logits[0, 32:]).any()


@pytest.mark.torch
@pytest.mark.skipif(not HAS_TORCH, reason="torch is not installed")
def test_narrow_bitmask_warning_matches_xgrammar_word_for_word():
    xgr = pytest.importorskip("xgrammar")
    import torch

    def message(apply) -> str:
        with warnings.catch_warnings(record=True) as record:
            warnings.simplefilter("always")
            apply(torch.zeros((2, 70)), torch.zeros((2, 2), dtype=torch.int32))
        (warning,) = [w for w in record if "bitmask" in str(w.message)]
        assert warning.category is UserWarning
        return str(warning.message)

    theirs = message(xgr.apply_token_bitmask_inplace)
    assert message(pg.apply_token_mask) == theirs
    # A filter written for xgrammar's warning silences ours.
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        warnings.filterwarnings("ignore", message="The bitmask covers only", category=UserWarning)
        pg.apply_token_mask(np.zeros((1, 40), np.float32), np.zeros((1, 1), np.int32))


def test_exact_width_does_not_warn():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        pg.apply_token_mask(np.zeros((1, 64), np.float32), np.zeros((1, 2), np.int32))


@pytest.mark.torch
@pytest.mark.skipif(not HAS_TORCH, reason="torch is not installed")
def test_bitmask_on_another_device_is_rejected():
    import torch

    logits = torch.zeros(1, 32)
    bitmask = torch.zeros(1, 1, dtype=torch.int32, device="meta")
    with pytest.raises(ValueError, match="CPU or on the logits' device \\(cpu\\), got meta"):
        pg.apply_token_mask(logits, bitmask)


@pytest.mark.parametrize("framework", framework_params())
def test_logits_whose_rows_share_memory_are_refused(framework):
    """``expand`` (stride 0) makes every row the same memory: masking row 0 would mask row 1
    too. Refused before anything is written."""
    if framework == "numpy":
        logits = np.broadcast_to(np.arange(64, dtype=np.float32), (2, 64))
    elif framework == "torch":
        import torch

        logits = torch.arange(64, dtype=torch.float32).expand(2, 64)
    else:
        pytest.skip("Paddle's expand copies: its tensors never alias rows")
    bitmask = np.full((2, 2), -1, np.int32)
    bitmask[0] = 0
    before = np.array(to_f32(logits), copy=True)
    with pytest.raises(ValueError, match=r"share memory \(shape \(2, 64\), strides \(0, 1\)"):
        pg.apply_token_mask(logits, bitmask)
    np.testing.assert_array_equal(to_f32(logits), before)


@pytest.mark.parametrize("framework", framework_params())
def test_logits_with_strided_columns_are_masked_like_the_reference(framework):
    """A transposed view has non-contiguous columns but no aliasing: it is masked exactly."""
    if framework == "paddle":
        pytest.skip("Paddle transposes by copying")
    rng = np.random.default_rng(3)
    base = rng.standard_normal((64, 3)).astype(np.float32)
    bitmask = rng.integers(-2**31, 2**31, (3, 2), dtype=np.int64).astype(np.int32)
    expected = pg.reference_apply_token_mask(base.T.copy(), bitmask)
    logits = make(base, framework).T
    pg.apply_token_mask(logits, bitmask)
    np.testing.assert_array_equal(to_f32(logits), expected)


def test_an_empty_batch_is_a_no_op_for_every_kernel():
    from portable_guided.validation import plan_mask

    logits = np.zeros((0, 64), np.float32)
    bitmask = np.zeros((0, 2), np.int32)
    assert plan_mask(logits, bitmask, indices=None, vocab_size=None, stacklevel=1,
                     framework="numpy", device_type="cpu").is_noop


@pytest.mark.parametrize("framework", ["numpy", "torch"])
def test_apply_token_mask_takes_an_empty_batch(framework):
    logits = np.zeros((0, 64), np.float32)
    bitmask = np.zeros((0, 2), np.int32)
    if framework == "torch":
        torch = pytest.importorskip("torch")
        logits, bitmask = torch.from_numpy(logits), torch.from_numpy(bitmask)
    assert pg.apply_token_mask(logits, bitmask) is logits
