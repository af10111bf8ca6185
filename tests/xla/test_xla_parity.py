"""XLA parity: ``apply_token_mask`` on torch_xla logits equals the NumPy reference.

Every bucket of a small bucket policy, with and without indices (list and tensor), float32 and
bfloat16, plus the shapes engines actually pass: column slices of a wider logits buffer, 1-D
logits, a bitmask already on the device, and ``vocab_size`` narrower than the logits.
"""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
torch_xla = pytest.importorskip("torch_xla")

import portable_guided as pg
from portable_guided import reference_apply_token_mask as reference
from tests.xla.xla_support import random_bitmask, xla_counts

pytestmark = pytest.mark.xla

VOCAB = 1000  # not a multiple of 32: the last word is partly outside the vocabulary
WORDS = -(-VOCAB // 32)
BUCKETS = pg.bucket_sizes(32)  # (8, 16, 32)
DTYPES = ["float32", "bfloat16"]


@pytest.fixture(scope="module")
def device():
    return torch_xla.device()


def _host_logits(rng: np.random.Generator, rows: int, width: int, dtype: str) -> torch.Tensor:
    values = torch.from_numpy(rng.standard_normal((rows, width), dtype=np.float32))
    return values.to(getattr(torch, dtype))


def _f32(tensor: torch.Tensor) -> np.ndarray:
    return tensor.detach().cpu().float().numpy()


def _indices(mode: str, rng: np.random.Generator, rows: int):
    if mode == "none":
        return None
    chosen = np.sort(rng.choice(rows, size=rng.integers(1, rows + 1), replace=False))
    return chosen.tolist() if mode == "list" else torch.from_numpy(chosen.astype(np.int64))


def test_xla_logits_resolve_to_the_static_strategy(device) -> None:
    resolution = pg.resolve(torch.zeros(2, 8, device=device))
    assert resolution.platform.name == "xla"
    assert resolution.platform.static_shapes
    assert resolution.kernel_name.endswith("static_torch.apply_static_torch")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rows", BUCKETS)
@pytest.mark.parametrize("index_mode", ["none", "list", "tensor"])
def test_every_bucket_matches_reference(device, rows: int, dtype: str, index_mode: str) -> None:
    rng = np.random.default_rng([rows, len(dtype), len(index_mode)])
    host = _host_logits(rng, rows, VOCAB, dtype)
    bitmask = random_bitmask(rng, rows, WORDS)
    indices = _indices(index_mode, rng, rows)
    logits = host.to(device)

    out = pg.apply_token_mask(logits, torch.from_numpy(bitmask), indices=indices)
    torch_xla.sync()

    assert out is logits
    ref_indices = None if indices is None else [int(i) for i in indices]
    expected = reference(host.float().numpy(), bitmask, indices=ref_indices)
    np.testing.assert_array_equal(_f32(logits), expected)


@pytest.mark.parametrize("dtype", DTYPES)
def test_column_slice_of_wider_logits(device, dtype: str) -> None:
    rng = np.random.default_rng(7)
    host = _host_logits(rng, 8, VOCAB + 40, dtype)
    bitmask = random_bitmask(rng, 8, WORDS)
    wide = host.to(device)

    pg.apply_token_mask(wide[:, 16 : 16 + VOCAB], torch.from_numpy(bitmask), indices=[0, 2, 5])
    torch_xla.sync()

    expected = host.float().numpy()
    expected[:, 16 : 16 + VOCAB] = reference(expected[:, 16 : 16 + VOCAB], bitmask, indices=[0, 2, 5])
    np.testing.assert_array_equal(_f32(wide), expected)


def test_one_dimensional_logits(device) -> None:
    rng = np.random.default_rng(11)
    host = _host_logits(rng, 1, VOCAB, "float32")[0]
    bitmask = random_bitmask(rng, 1, WORDS)[0]
    logits = host.to(device)

    pg.apply_token_mask(logits, torch.from_numpy(bitmask))
    torch_xla.sync()

    np.testing.assert_array_equal(_f32(logits), reference(host.numpy(), bitmask))


@pytest.mark.parametrize("index_mode", ["none", "list"])
def test_bitmask_already_on_device(device, index_mode: str) -> None:
    rng = np.random.default_rng(13)
    host = _host_logits(rng, 16, VOCAB, "bfloat16")
    bitmask = random_bitmask(rng, 16, WORDS)
    indices = _indices(index_mode, rng, 16)
    logits, device_bitmask = host.to(device), torch.from_numpy(bitmask).to(device)
    torch_xla.sync()

    before = xla_counts()
    pg.apply_token_mask(logits, device_bitmask, indices=indices)
    torch_xla.sync()
    window = xla_counts() - before

    np.testing.assert_array_equal(_f32(logits), reference(host.float().numpy(), bitmask, indices=indices))
    # Nothing comes back to the host; at most the small row selector goes to the device.
    assert window.d2h_transfers == 0
    assert window.h2d_bytes <= 16 * 8


def test_vocab_size_narrower_than_logits(device) -> None:
    rng = np.random.default_rng(17)
    host = _host_logits(rng, 8, VOCAB, "float32")
    bitmask = random_bitmask(rng, 8, WORDS)
    logits = host.to(device)

    pg.apply_token_mask(logits, torch.from_numpy(bitmask), vocab_size=900)
    torch_xla.sync()

    np.testing.assert_array_equal(_f32(logits), reference(host.numpy(), bitmask, vocab_size=900))
    assert np.isfinite(_f32(logits)[:, 900:]).all()


def test_narrow_bitmask_warns_and_leaves_the_tail(device) -> None:
    rng = np.random.default_rng(19)
    host = _host_logits(rng, 8, VOCAB, "float32")
    bitmask = random_bitmask(rng, 8, 20)  # covers 640 of 1000 columns
    logits = host.to(device)

    with pytest.warns(UserWarning, match="covers only 640 tokens but logits have 1000"):
        pg.apply_token_mask(logits, torch.from_numpy(bitmask))
    torch_xla.sync()

    np.testing.assert_array_equal(_f32(logits), reference(host.numpy(), bitmask))


def test_bad_input_leaves_device_logits_untouched(device) -> None:
    host = _host_logits(np.random.default_rng(23), 8, VOCAB, "float32")
    logits = host.to(device)
    with pytest.raises(ValueError, match=r"indices \[9\] out of range"):
        pg.apply_token_mask(logits, torch.zeros(8, WORDS, dtype=torch.int32), indices=[1, 9])
    torch_xla.sync()
    np.testing.assert_array_equal(_f32(logits), host.numpy())
