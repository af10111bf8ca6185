"""The reference itself, against values worked out by hand."""

import numpy as np
import pytest

from portable_guided import reference_apply_token_mask as reference

INF = np.inf


def test_bits_map_to_tokens_lowest_bit_first():
    logits = np.arange(6, dtype=np.float32)
    out = reference(logits, np.array([0b100101], dtype=np.int32))
    np.testing.assert_array_equal(out, [0, -INF, 2, -INF, -INF, 5])
    np.testing.assert_array_equal(logits, np.arange(6))  # input untouched


def test_top_bit_of_a_word_is_token_31():
    logits = np.zeros((1, 40), dtype=np.float32)
    bitmask = np.array([[np.int32(-(2**31)), 0b1]], dtype=np.int32)
    out = reference(logits, bitmask)
    assert np.flatnonzero(out[0] == 0).tolist() == [31, 32]


def test_indices_and_vocab_size():
    logits = np.zeros((3, 8), dtype=np.float32)
    bitmask = np.zeros((3, 1), dtype=np.int32)
    out = reference(logits, bitmask, indices=[2], vocab_size=5)
    assert np.isinf(out).sum() == 5
    np.testing.assert_array_equal(out[2], [-INF] * 5 + [0] * 3)


@pytest.mark.parametrize("width,expected", [(40, 32), (20, 20)])
def test_default_vocab_is_what_both_cover(width, expected):
    out = reference(np.zeros((1, width), np.float32), np.zeros((1, 1), np.int32))
    assert np.isinf(out).sum() == expected
