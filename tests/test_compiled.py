"""The compiled CPU kernel (``portable_guided/kernels/_cpu_mask.c``) against the NumPy reference.

Whole-pipeline parity for every framework is in test_parity.py; here the extension itself:
each kind of bitmask word, every tail length, thread splits that cut rows, strided rows, a
bitmask row per logits row given separately, bad input, and the OpenMP runtime it joins.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

from portable_guided import reference_apply_token_mask as reference

try:
    from portable_guided.kernels import _cpu_mask
except ImportError:
    _cpu_mask = None

compiler = shutil.which(os.environ.get("CC", "cc")) or shutil.which("gcc")
needs_kernel = pytest.mark.skipif(_cpu_mask is None, reason="compiled kernel not built")
NEG = {np.float32: 0xFF800000, np.float16: 0xFC00}
BITS = {np.float32: np.uint32, np.float16: np.uint16}


@pytest.mark.skipif(compiler is None, reason="no C compiler: the package installs without it")
def test_built_where_a_compiler_is_found():
    """A C compiler was there at install, so the extension must be too (else CI would test
    only the NumPy fallback)."""
    assert _cpu_mask is not None


def _words(rng: np.random.Generator, rows: int, words: int) -> np.ndarray:
    """Rows mixing every kind of word: all allowed, all blocked, 1 to 31 blocked, random."""
    kinds = rng.integers(0, 4, (rows, words))
    out = rng.integers(0, 2**32, (rows, words), dtype=np.uint64).astype(np.uint32)
    out[kinds == 0] = 0xFFFFFFFF
    out[kinds == 1] = 0
    few = kinds == 2
    cleared = rng.integers(1, 32, few.sum())
    out[few] = [np.uint32(0xFFFFFFFF) & ~np.uint32(sum(1 << int(b) for b in
                                                      rng.choice(32, n, replace=False)))
                for n in cleared]
    return out


def _mask(values, words, rows, bitmask_rows, vocab, threads):
    bits = values.view(BITS[values.dtype.type])
    _cpu_mask.mask_rows(bits, words, np.asarray(rows, np.int64),
                        np.asarray(bitmask_rows, np.int64), vocab, NEG[values.dtype.type],
                        threads)


@needs_kernel
@pytest.mark.parametrize("dtype", [np.float32, np.float16])
@pytest.mark.parametrize("threads", [1, 2, 3, 0])
@pytest.mark.parametrize("vocab", [1, 31, 32, 33, 1000, 4097])
def test_matches_reference(dtype, threads, vocab):
    rng = np.random.default_rng(vocab * 7 + threads)
    batch, width = 5, vocab + 9  # columns past vocab stay as they are
    words = _words(rng, batch, -(-vocab // 32) + 1)  # a wider bitmask than needed
    values = rng.standard_normal((batch, width)).astype(dtype)
    expected = reference(values.astype(np.float32), words.view(np.int32), vocab_size=vocab)
    _mask(values, words, range(batch), range(batch), vocab, threads)
    np.testing.assert_array_equal(values.astype(np.float32), expected)


@needs_kernel
@pytest.mark.parametrize("threads", [1, 2, 3, 7])
def test_rows_split_inside_and_across_rows(threads):
    """Threads split the rows' words evenly, so a part may start or stop inside a row or at
    its tail word; every part boundary must mask exactly once."""
    rng = np.random.default_rng(threads)
    vocab = 3 * 32 + 5
    words = _words(rng, 7, 4)
    values = rng.standard_normal((7, vocab)).astype(np.float32)
    expected = reference(values, words.view(np.int32))
    _mask(values, words, range(7), range(7), vocab, threads)
    np.testing.assert_array_equal(values, expected)


@needs_kernel
def test_bitmask_rows_given_separately_and_strided_logits():
    """Row i of the logits is masked by row ``bitmask_rows[i]``; rows of a wider buffer (a
    strided view) keep the columns past the view."""
    rng = np.random.default_rng(3)
    vocab, width = 200, 230
    buffer = rng.standard_normal((6, width + 11)).astype(np.float32)
    view = buffer[:, :width]
    words = _words(rng, 3, -(-vocab // 32))
    rows, bitmask_rows = [4, 0, 2], [1, 2, 0]
    expected = buffer.copy()
    for row, mask_row in zip(rows, bitmask_rows):
        expected[row, :width] = reference(view[row], words[mask_row].view(np.int32),
                                          vocab_size=vocab)
    _mask(view, words, rows, bitmask_rows, vocab, 1)
    np.testing.assert_array_equal(buffer, expected)


@needs_kernel
@pytest.mark.parametrize("call,error,message", [
    (lambda b, w: _cpu_mask.mask_rows(b, w, np.arange(2), np.arange(3), 64, 0), ValueError,
     "rows and bitmask_rows differ in length: 2 vs 3"),
    (lambda b, w: _cpu_mask.mask_rows(b, w, np.array([0, 5]), np.arange(2), 64, 0),
     IndexError, r"row pair 1 is \(5, 1\), outside the 4 logits rows and 4 bitmask rows"),
    (lambda b, w: _cpu_mask.mask_rows(b, w, np.arange(2), np.arange(2), 65, 0), ValueError,
     r"vocab 65 must be in \[0, 64\] \(logits columns\) and at most 64 \(bitmask bits\)"),
    (lambda b, w: _cpu_mask.mask_rows(b, w, np.arange(2, dtype=np.int32), np.arange(2), 64,
                                      0), TypeError, "rows must be a contiguous 1-D int64"),
    (lambda b, w: _cpu_mask.mask_rows(b.astype(np.uint64), w, np.arange(2), np.arange(2), 64,
                                      0), ValueError, "2- or 4-byte items"),
    (lambda b, w: _cpu_mask.mask_rows(b[:, ::2], w, np.arange(2), np.arange(2), 32, 0),
     ValueError, "contiguous columns"),
    (lambda b, w: _cpu_mask.mask_rows(b, w, np.arange(2), np.arange(2), 64, 0, -1), ValueError,
     "threads must be >= 0, got -1"),
])
def test_bad_input_raises_and_writes_nothing(call, error, message):
    bits = np.arange(4 * 64, dtype=np.uint32).reshape(4, 64)
    words = np.zeros((4, 2), np.uint32)
    with pytest.raises(error, match=message):
        call(bits, words)
    np.testing.assert_array_equal(bits, np.arange(4 * 64, dtype=np.uint32).reshape(4, 64))


@needs_kernel
def test_read_only_logits_are_refused():
    bits = np.zeros((2, 32), np.uint32)
    bits.flags.writeable = False
    with pytest.raises(ValueError, match="read-only"):
        _cpu_mask.mask_rows(bits, np.zeros((2, 1), np.uint32), np.arange(2), np.arange(2), 32,
                            0)


def test_unknown_kernel_choice_raises(monkeypatch):
    from portable_guided.kernels import compiled

    monkeypatch.setenv(compiled.KERNEL_ENV_VAR, "fast")
    with pytest.raises(ValueError, match="must be 'compiled' or 'numpy', got 'fast'"):
        compiled.available()


def _in_fresh_process(code: str) -> str:
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120, check=True)
    return done.stdout.strip()


@needs_kernel
@pytest.mark.torch
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Torch's Linux wheels bundle "
                    "libgomp; other builds may use another runtime or none")
def test_joins_the_openmp_runtime_torch_loaded():
    """No runtime before Torch is imported (nothing is linked), Torch's libgomp after."""
    code = ("from portable_guided.kernels import _cpu_mask as k; print(k.openmp_runtime()); "
            "import torch; print(k.openmp_runtime())")
    before, after = _in_fresh_process(code).splitlines()
    assert (before, after) == ("None", "libgomp.so.1")


def _reset_team_policy(late_ns: int) -> None:
    """The policy's process-wide state back to a fresh process's, with this threshold."""
    _cpu_mask.team_stats(10**15)  # never late
    values, words = np.zeros((1, 32 * 1024), np.float32), np.zeros((1, 1024), np.uint32)
    rows = np.zeros(1, np.int64)
    while _cpu_mask.team_stats()["skip"] or _cpu_mask.team_stats()["backoff"]:
        _cpu_mask.mask_rows(values.view(np.uint32), words, rows, rows, 32 * 1024, 0, 0)
    _cpu_mask.team_stats(late_ns)


@pytest.fixture
def team_policy():
    """The automatic thread policy with Torch's OpenMP team loaded, from a fresh state;
    yields the team's size."""
    torch = pytest.importorskip("torch")
    if _cpu_mask.openmp_runtime() is None or torch.get_num_threads() < 2:
        pytest.skip("needs an OpenMP runtime with a team of at least two threads")
    default = _cpu_mask.team_stats()["late_ns"]
    _reset_team_policy(10**15)  # the machine's load must not make a team late here
    yield torch.get_num_threads()
    _reset_team_policy(default)


def _auto(values, words, vocab):
    bits = values.view(BITS[values.dtype.type])
    rows = np.arange(values.shape[0], dtype=np.int64)
    return _cpu_mask.mask_rows(bits, words, rows, rows, vocab, NEG[values.dtype.type], 0)


@needs_kernel
def test_automatic_threads_follow_the_work(team_policy):
    """threads=0: nothing to mask runs nothing, light work (under 1,024 blocking words) the
    calling thread, heavy work the whole team; every one exact."""
    rng = np.random.default_rng(5)
    vocab = 40_000
    words = np.full((4, vocab // 32), 0xFFFFFFFF, np.uint32)
    cases = {"empty": (words.copy(), 0)}
    light = words.copy()
    light[1, :1023] = rng.integers(0, 2**31, 1023)  # 1,023 blocking words: one too few
    cases["light"] = (light, 1)
    heavy = light.copy()
    heavy[2, 7] = 0  # the 1,024th
    cases["heavy"] = (heavy, team_policy)
    for name, (table, threads) in cases.items():
        values = rng.standard_normal((4, vocab)).astype(np.float32)
        expected = reference(values, table.view(np.int32))
        assert _auto(values, table, vocab) == threads, name
        np.testing.assert_array_equal(values, expected, err_msg=name)


@needs_kernel
def test_tail_bits_past_the_vocabulary_are_not_work(team_policy):
    """A tail word's bits past ``vocab`` are cleared (as llguidance leaves them) yet block
    nothing: an otherwise all-allowed batch has nothing to mask."""
    vocab = 32 * 100 + 5
    words = np.full((3, 101), 0xFFFFFFFF, np.uint32)
    words[:, 100] = 0b11111
    values = np.ones((3, vocab), np.float32)
    assert _auto(values, words, vocab) == 0
    words[2, 100] = 0b01111
    assert _auto(values, words, vocab) == 1
    assert values[2, 32 * 100 + 4] == -np.inf and np.isfinite(np.delete(values[2], -1)).all()


@needs_kernel
def test_a_late_team_sends_the_next_calls_to_the_calling_thread(team_policy):
    """A team whose last member starts later than late_ns (a core busy elsewhere) makes the
    next 16 calls run on the calling thread, exactly; then the team is tried again, and a
    late retry doubles the wait."""
    rng = np.random.default_rng(6)
    vocab = 32 * 2048
    words = np.zeros((1, 2048), np.uint32)  # 2,048 blocking words: heavy
    values = rng.standard_normal((1, vocab)).astype(np.float32)
    before = _cpu_mask.team_stats(0)  # every team is late: it starts after the call did
    assert _auto(values.copy(), words, vocab) == team_policy
    after = _cpu_mask.team_stats()
    assert after["late"] == before["late"] + 1 and after["last_lateness_ns"] > 0
    assert (after["skip"], after["backoff"]) == (16, 16)
    for left in range(15, -1, -1):
        out = values.copy()
        assert _auto(out, words, vocab) == 1
        assert (out == -np.inf).all()
        assert _cpu_mask.team_stats()["skip"] == left
    assert _auto(values.copy(), words, vocab) == team_policy  # tried again: late again
    assert _cpu_mask.team_stats()["backoff"] == 32
    _cpu_mask.team_stats(10**12)  # never late: the next team call clears the backoff
    for _ in range(32):
        _auto(values.copy(), words, vocab)
    assert _auto(values.copy(), words, vocab) == team_policy
    assert _cpu_mask.team_stats()["backoff"] == 0


@needs_kernel
def test_explicit_threads_skip_the_policy(team_policy):
    """threads=N is obeyed as given, even for light work or after a late team."""
    vocab = 64
    words = np.full((1, 2), 0xFFFFFFFF, np.uint32)
    values = np.ones((1, vocab), np.float32)
    bits, rows = values.view(np.uint32), np.zeros(1, np.int64)
    assert _cpu_mask.mask_rows(bits, words, rows, rows, vocab, NEG[np.float32], 2) == 2
    assert _cpu_mask.mask_rows(bits, words, rows, rows, vocab, NEG[np.float32], 1) == 1


@needs_kernel
def test_team_stats_rejects_a_negative_threshold():
    with pytest.raises(ValueError, match="late_ns must be >= 0, got -1"):
        _cpu_mask.team_stats(-1)


@pytest.fixture
def plain_torch():
    torch = pytest.importorskip("torch")
    if _cpu_mask is None:
        pytest.skip("compiled kernel not built")
    from portable_guided.kernels import compiled

    return torch, compiled.apply_plain_torch


@pytest.mark.torch
@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16"])
@pytest.mark.parametrize("batch", [1, 3, 70])  # 70 x 1,000: over the team's threshold
def test_plain_torch_path_matches_reference(plain_torch, dtype, batch):
    torch, apply_plain = plain_torch
    rng = np.random.default_rng(batch)
    width = 1000 if batch < 70 else 33_000
    words = _words(rng, batch, -(-width // 32)).view(np.int32)
    logits = torch.randn(batch, width, generator=torch.Generator().manual_seed(batch))
    logits = logits.to(getattr(torch, dtype))
    expected = reference(logits.float().numpy(), words)
    assert apply_plain(logits, torch.from_numpy(words)) is True
    np.testing.assert_array_equal(logits.float().numpy(), expected)


@pytest.mark.torch
def test_plain_torch_path_declines_everything_else(plain_torch):
    """Each call that is not the plain case returns False and writes nothing, so the
    general path checks it (its warnings and errors included)."""
    torch, apply_plain = plain_torch
    logits = torch.randn(4, 100)
    mask = torch.zeros(4, 4, dtype=torch.int32)
    declined = {
        "1-D logits": (logits[0], mask[0]),
        "column slice": (torch.randn(4, 200)[:, :100], mask),
        "narrow bitmask": (logits, mask[:, :3]),
        "int64 bitmask": (logits, mask.long()),
        "row count": (logits, mask[:3]),
        "strided bitmask": (logits, torch.zeros(4, 8, dtype=torch.int32)[:, ::2]),
        "float64 logits": (logits.double(), mask),
        "requires grad": (logits.clone().requires_grad_(), mask),
        "a subclass": (torch.nn.Parameter(logits.clone(), requires_grad=False), mask),
        "numpy bitmask": (logits, mask.numpy()),
        "no columns": (torch.randn(4, 0), mask),
    }
    for name, (values, bitmask) in declined.items():
        before = values.detach().clone()
        assert apply_plain(values, bitmask) is False, name
        assert torch.equal(values.detach(), before), name


@pytest.mark.torch
def test_apply_token_mask_takes_the_plain_path_only_where_nothing_else_is_asked(
        plain_torch, monkeypatch):
    """``apply_token_mask``: the plain path serves plain calls once the registry chose the
    host kernel for Torch CPU logits; a forced platform, ``indices`` or ``vocab_size`` go the
    general way, and a narrow bitmask still warns."""
    torch, _ = plain_torch
    import portable_guided as pg
    from portable_guided import apply as apply_module

    logits, mask = torch.randn(2, 64), torch.zeros(2, 2, dtype=torch.int32)
    mask[:, 0] = 1
    pg.apply_token_mask(logits, mask)  # the registry resolves Torch CPU logits once
    assert apply_module._plain_call(logits, mask) is True
    assert torch.isinf(logits[:, 1:]).all() and torch.isfinite(logits[:, 0]).all()
    monkeypatch.setenv("PORTABLE_GUIDED_PLATFORM", "static")
    assert apply_module._plain_call(logits, mask) is False
    monkeypatch.delenv("PORTABLE_GUIDED_PLATFORM")
    monkeypatch.setenv("PORTABLE_GUIDED_CPU_KERNEL", "numpy")
    assert apply_module._plain_call(logits, mask) is False
    monkeypatch.delenv("PORTABLE_GUIDED_CPU_KERNEL")
    with pytest.warns(UserWarning, match="covers only 32 tokens but logits have 64"):
        pg.apply_token_mask(torch.randn(2, 64), mask[:, :1])
    with pytest.raises(TypeError, match="bitmask must be int32, got int64"):
        pg.apply_token_mask(torch.randn(2, 64), mask.long())
