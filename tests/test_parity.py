"""Every implementation available here against the NumPy reference (property-based).

Implementations: the CPU kernel for NumPy, Torch and Paddle logits, and the static-shape
kernels for Torch and Paddle forced onto CPU tensors with ``platform=``. CUDA parity lives in
``test_cuda.py``; XLA parity in ``tests/xla``.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import portable_guided as pg
from portable_guided import reference_apply_token_mask as reference
from tests.support import cpu_kernel, frameworks, make, to_f32

# (framework, platform, CPU kernel): the CPU platform runs the compiled kernel where it is
# built and the NumPy kernel otherwise; both are checked here.
IMPLEMENTATIONS = [
    pytest.param(fw, platform, kernel, id=f"{fw}-{platform or 'auto'}-{kernel or 'static'}",
                 marks=[getattr(pytest.mark, fw)] if fw != "numpy" else [])
    for fw in frameworks()
    for platform, kernel in ((None, "compiled"), (None, "numpy"), ("static", None))
    if fw != "numpy" or platform is None
]
DTYPES = {"numpy": ["float32", "float16"], "torch": ["float32", "float16", "bfloat16"],
          "paddle": ["float32", "float16", "bfloat16"]}


@st.composite
def cases(draw, framework: str):
    batch = draw(st.integers(1, 6))
    width = draw(st.integers(1, 300))
    one_d = batch == 1 and draw(st.booleans())
    words = max(1, -(-width // 32) + draw(st.integers(-1, 1)))
    dtype = draw(st.sampled_from(DTYPES[framework]))
    bitmask_framework = draw(st.sampled_from(frameworks()))
    kind = draw(st.sampled_from(["random", "sparse", "nearly-full", "all-allowed", "all-masked",
                                 "mixed"]))
    with_indices = not one_d and draw(st.booleans())
    bitmask_rows = batch if not with_indices else draw(st.integers(1, batch + 2))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    bitmask = _bitmask(rng, kind, bitmask_rows, words)
    indices = None
    if with_indices:
        limit = min(batch, bitmask_rows)
        chosen = draw(st.lists(st.integers(0, limit - 1), unique=True, max_size=limit))
        indices = chosen if draw(st.booleans()) else make(np.array(chosen, np.int64), framework)
    covered = min(width, 32 * words)
    vocab_size = draw(st.one_of(st.none(), st.integers(0, covered)))
    column_offset = draw(st.integers(0, 3))  # > 0: logits are a column slice of a wider tensor
    return {"batch": batch, "width": width, "one_d": one_d, "dtype": dtype, "bitmask": bitmask,
            "bitmask_framework": bitmask_framework, "indices": indices, "vocab_size": vocab_size,
            "column_offset": column_offset, "rng": rng}


def _bitmask(rng, kind, rows, words):
    if kind == "all-allowed":
        return np.full((rows, words), -1, np.int32)
    if kind == "all-masked":
        return np.zeros((rows, words), np.int32)
    random = rng.integers(-(2**31), 2**31, size=(rows, words), dtype=np.int64).astype(np.int32)
    if kind == "random":
        return random
    sparse = np.where(rng.random((rows, words)) < 0.05, random, 0).astype(np.int32)
    if kind == "sparse":
        return sparse
    # A few blocked tokens (e.g. inside a JSON string): a word or two with one bit cleared.
    one_bit = (np.int64(1) << rng.integers(0, 32, size=(rows, words))).astype(np.uint32)
    nearly_full = np.where(rng.random((rows, words)) < 0.05, ~one_bit, 0xFFFFFFFF)
    nearly_full = nearly_full.astype(np.uint32).view(np.int32)
    if kind == "nearly-full":
        return nearly_full
    choice = rng.integers(0, 4, size=(rows, 1))  # per row: sparse, random, all-allowed, nearly full
    return np.select([choice == 0, choice == 1, choice == 2], [sparse, random, -1],
                     nearly_full).astype(np.int32)


def _logits(case, framework):
    rng = case["rng"]
    offset = case["column_offset"]
    full = rng.standard_normal((case["batch"], case["width"] + offset + 1)).astype(np.float32)
    wide = make(full, framework, case["dtype"])
    view = wide[:, offset : offset + case["width"]] if offset else wide[:, : case["width"]]
    if case["one_d"]:
        view = view[0]
    return wide, view


@pytest.mark.parametrize("framework,platform,kernel", IMPLEMENTATIONS)
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_matches_reference(framework, platform, kernel, data):
    case = data.draw(cases(framework))
    wide, logits = _logits(case, framework)
    bitmask = make(case["bitmask"], case["bitmask_framework"])
    if case["one_d"] and data.draw(st.booleans()):
        bitmask = bitmask[0]
    before_wide = to_f32(wide)
    before = to_f32(logits)
    index_list = None
    if case["indices"] is not None:
        index_list = [int(i) for i in np.asarray(to_f32(case["indices"]) if not isinstance(
            case["indices"], list) else case["indices"]).tolist()]
    expected = reference(before, case["bitmask"].reshape(np.shape(bitmask)), indices=index_list,
                         vocab_size=case["vocab_size"])

    with warnings.catch_warnings(), cpu_kernel(kernel):
        warnings.simplefilter("ignore")  # narrower bitmasks warn; covered in test_errors
        result = pg.apply_token_mask(logits, bitmask, indices=case["indices"],
                                     vocab_size=case["vocab_size"], platform=platform)

    assert result is logits
    np.testing.assert_array_equal(to_f32(logits), expected)
    # Nothing outside the view changed.
    after_wide = to_f32(wide)
    offset = case["column_offset"]
    outside = np.ones(before_wide.shape, bool)
    rows = slice(0, 1) if case["one_d"] else slice(None)
    outside[rows, offset : offset + case["width"]] = False
    np.testing.assert_array_equal(after_wide[outside], before_wide[outside])


@pytest.mark.parametrize("framework,platform,kernel", IMPLEMENTATIONS)
@pytest.mark.parametrize("kind", ["sparse", "random", "nearly-full", "mixed"])
def test_large_vocab_matches_reference(framework, platform, kernel, kind):
    """A real vocabulary width exercises the sparse and dense paths at scale."""
    rng = np.random.default_rng(7)
    batch, width = 3, 129_280
    words = -(-width // 32)
    bitmask = _bitmask(rng, kind, batch, words)
    bitmask[0, :] = 0
    bitmask[0, rng.integers(0, words, 40)] = 1 << 3  # a JSON-like row: a few allowed tokens
    values = rng.standard_normal((batch, width)).astype(np.float32)
    logits = make(values, framework)
    with cpu_kernel(kernel):
        pg.apply_token_mask(logits, make(bitmask, framework), platform=platform)
    np.testing.assert_array_equal(to_f32(logits), reference(values, bitmask))


@pytest.mark.parametrize("framework,platform,kernel", IMPLEMENTATIONS)
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("threads", [None, "1", "2", "3"])
def test_large_batch_matches_reference(framework, platform, kernel, dtype, threads,
                                       monkeypatch):
    """Work above the kernels' parallel thresholds (an OpenMP team or Torch's intra-op pool
    for Torch logits, the kernel's threads otherwise, or ``PORTABLE_GUIDED_CPU_THREADS``
    threads; 3 splits rows and words unevenly), with rows in several runs through
    ``indices``."""
    if dtype not in DTYPES[framework]:
        pytest.skip(f"{framework} has no {dtype}")
    if threads is None:
        monkeypatch.delenv("PORTABLE_GUIDED_CPU_THREADS", raising=False)
    else:
        monkeypatch.setenv("PORTABLE_GUIDED_CPU_THREADS", threads)
    rng = np.random.default_rng(11)
    batch, width = 40, 129_280
    words = -(-width // 32)
    bitmask = _bitmask(rng, "mixed", batch, words)
    bitmask[:16] = _bitmask(rng, "sparse", 16, words)  # >= 4 MB of sparse rows
    indices = [i for i in range(batch) if i % 7 != 3]  # several runs of rows
    values = rng.standard_normal((batch, width)).astype(np.float32)
    logits = make(values, framework, dtype)
    before = to_f32(logits)
    with cpu_kernel(kernel):
        pg.apply_token_mask(logits, make(bitmask, framework), indices=indices,
                            platform=platform)
    np.testing.assert_array_equal(to_f32(logits), reference(before, bitmask, indices=indices))


@pytest.mark.torch
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("kernel", ["compiled", "numpy"])
def test_inference_mode_logits(dtype, kernel, monkeypatch):
    """Logits made under ``torch.inference_mode()`` (as engines make them) are masked in place
    outside it too, above the size where the fill runs as a Torch op."""
    torch = pytest.importorskip("torch")
    monkeypatch.delenv("PORTABLE_GUIDED_CPU_THREADS", raising=False)
    rng = np.random.default_rng(5)
    batch, width = 40, 129_280
    bitmask = _bitmask(rng, "mixed", batch, -(-width // 32))
    bitmask[:20] = _bitmask(rng, "sparse", 20, bitmask.shape[1])
    values = rng.standard_normal((batch, width)).astype(np.float32)
    with torch.inference_mode():
        logits = make(values, "torch", dtype)
    before = to_f32(logits)
    with cpu_kernel(kernel):
        pg.apply_token_mask(logits, torch.from_numpy(bitmask))
    np.testing.assert_array_equal(to_f32(logits), reference(before, bitmask))


@pytest.mark.torch
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("kernel", ["compiled", "numpy"])
def test_logits_that_require_grad(dtype, kernel):
    """A forward's output outside ``no_grad`` (requires grad, not a leaf) is masked in place."""
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(9)
    bitmask = _bitmask(rng, "mixed", 3, 4)
    weight = torch.ones(1, requires_grad=True)
    logits = torch.from_numpy(rng.standard_normal((3, 128)).astype(np.float32)).to(
        getattr(torch, dtype)) * weight
    before = to_f32(logits.detach())
    with cpu_kernel(kernel):
        pg.apply_token_mask(logits, torch.from_numpy(bitmask))
    np.testing.assert_array_equal(to_f32(logits.detach()), reference(before, bitmask))


@pytest.mark.torch
@pytest.mark.xgrammar
@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16"])
@pytest.mark.parametrize("route", ["xgrammar", "numpy"])
@pytest.mark.parametrize("pick_rows", [True, False])
def test_few_blocked_torch_rows_on_both_routes(dtype, route, pick_rows, monkeypatch):
    """Torch rows blocking a small share of the vocabulary go to xgrammar's CPU kernel when
    it is installed (``PORTABLE_GUIDED_CPU_XGRAMMAR=0``: our NumPy paths); both match the
    reference, with indices, a padded width and rows of every kind in one batch."""
    pytest.importorskip("xgrammar")
    from portable_guided.kernels import host

    monkeypatch.delenv("PORTABLE_GUIDED_CPU_THREADS", raising=False)
    monkeypatch.setenv("PORTABLE_GUIDED_CPU_KERNEL", "numpy")  # the route is the fallback's
    monkeypatch.setenv("PORTABLE_GUIDED_CPU_XGRAMMAR", "1" if route == "xgrammar" else "0")
    calls = []
    real = host._apply_xgrammar
    monkeypatch.setattr(host, "_apply_xgrammar",
                        lambda tensor, *a: (calls.append(a[1].tolist()), real(tensor, *a)))
    rng = np.random.default_rng(23)
    batch, vocab, width = 12, 50_000, 50_017  # logits wider than the vocabulary
    words = -(-vocab // 32)
    bitmask = _bitmask(rng, "mixed", batch, words)
    blocked_15 = rng.random((4, words * 32)) < 0.15  # between 1/16 and 1/4 blocked
    bitmask[4:8] = np.packbits(~blocked_15, axis=1, bitorder="little").view(np.int32)
    bitmask[8] = _bitmask(rng, "nearly-full", 1, words)[0]
    indices = [0, 2, 4, 5, 6, 7, 8, 11] if pick_rows else None
    values = rng.standard_normal((batch, width)).astype(np.float32)
    logits = make(values, "torch", dtype)
    before = to_f32(logits)
    pg.apply_token_mask(logits, make(bitmask, "torch"), indices=indices, vocab_size=vocab)
    expected = reference(before, bitmask, indices=indices, vocab_size=vocab)
    np.testing.assert_array_equal(to_f32(logits), expected)
    if route == "xgrammar":
        # 15% blocked rows take the route in float32 only (host.XGRAMMAR_MAX_BLOCKED).
        assert calls and ({4, 5, 6, 7, 8} if dtype == "float32" else {8}) <= set(calls[0])
    else:
        assert calls == []


@pytest.mark.parametrize("rows,words", [(1, 1), (3, 5), (4, 6), (7, 4040)])
def test_set_bits_finds_every_set_bit(rows, words):
    """The sparse path's bit finder (8-byte units when the word count is even, 4-byte ones
    otherwise) against ``np.nonzero`` of the unpacked bits, with logits row numbers."""
    from portable_guided.kernels.host import _set_bits

    rng = np.random.default_rng(rows * 1000 + words)
    table = np.where(rng.random((rows, words)) < 0.1,
                     rng.integers(0, 2**32, (rows, words), dtype=np.uint64), 0).astype(np.uint32)
    table[0, -1] = 0x80000001  # the first and last bit of a row's last word
    logits_rows = rng.permutation(rows * 3)[:rows]
    expected_row, expected_col = np.nonzero(
        np.unpackbits(table.view(np.uint8), axis=1, bitorder="little"))
    row_of, cols = _set_bits(table, logits_rows)
    np.testing.assert_array_equal(row_of, logits_rows[expected_row])
    np.testing.assert_array_equal(cols, expected_col)
