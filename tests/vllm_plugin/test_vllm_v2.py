"""Our Model Runner V2 apply against vLLM's own V2 method (its Triton kernel transliterated,
see ``reference.py``) and against the other version's mapping, ported.

Covers both layouts (compact rows of vLLM 0.32, ``mask_stride`` blocks of 0.33), speculative
rows, drafts trimmed on the device, unconstrained requests and shuffled scheduler order.
"""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch
import vllm
from vllm.v1.worker.gpu import structured_outputs as v2_module

from portable_guided.integrations.vllm import guard
from portable_guided.integrations.vllm.v2 import apply_v2

from .reference import make_worker, transliterated_v2_apply, v2_step, vllm_v2_apply

VERSION = str(vllm.__version__)
MATCHED = guard.match(guard.current(VERSION), "v2")
LAYOUT = MATCHED[1] if MATCHED else guard.layout_for_version(VERSION)
OTHER = "block" if LAYOUT == "compact" else "compact"
VLLM_METHOD = v2_module.StructuredOutputsWorker.apply_grammar_bitmask
if VLLM_METHOD.__module__.startswith("portable_guided"):  # pragma: no cover
    raise RuntimeError("vLLM's V2 method was already replaced at collection")


def test_installed_vllm_v2_is_a_verified_build():
    assert MATCHED == (VERSION, LAYOUT), (VERSION, guard.current(VERSION).values)


def _compare(step, dtype, layout, vocab):
    worker = make_worker(step["stride"], vocab, max_num_logits=64)
    logits = torch.randn(step["n_logits"], vocab).to(dtype)
    theirs, ours = logits.clone(), logits.clone()
    ib, grammar, bitmask = step["input_batch"], step["grammar"], step["bitmask"]
    if layout == LAYOUT:
        launches = vllm_v2_apply(VLLM_METHOD, worker, theirs, ib, grammar, bitmask)
        assert launches == 1
    else:
        transliterated_v2_apply(layout, theirs, ib, grammar, bitmask, step["stride"])
    apply_v2(worker, ours, ib, grammar, bitmask, layout)
    return logits, theirs, ours


@pytest.mark.parametrize("layout", [LAYOUT, OTHER])
@pytest.mark.parametrize("depth", [0, 1, 3])
def test_1000_random_steps_no_differing_mask(layout, depth):
    """The target: 0 differing masks in >= 1,000 random steps per (layout, depth)."""
    rng = random.Random(f"{layout}-{depth}")
    differing = masked = 0
    for _ in range(1000):
        vocab = 1000 + rng.randrange(64)
        step = v2_step(rng, vocab, depth, layout)
        logits, theirs, ours = _compare(step, torch.float32, layout, vocab)
        differing += not torch.equal(ours, theirs)
        masked += not torch.equal(theirs, logits)
    assert differing == 0
    assert masked >= 990  # the reference did mask: the comparison can fail


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_full_vocab_dtypes(dtype):
    rng = random.Random(11)
    for _ in range(10):
        step = v2_step(rng, 49_152, 3, LAYOUT)
        _, theirs, ours = _compare(step, dtype, LAYOUT, 49_152)
        assert torch.equal(ours, theirs)


def test_trimmed_positions_and_unconstrained_rows_untouched():
    """Positions at or beyond a request's device logits count, and requests without a
    grammar, keep their logits bit for bit."""
    rng = random.Random(5)
    seen_trim = 0
    for _ in range(200):
        step = v2_step(rng, 512, 3, LAYOUT)
        logits, theirs, ours = _compare(step, torch.bfloat16, LAYOUT, 512)
        ib = step["input_batch"]
        cu = ib.cu_num_logits.numpy()
        constrained = set()
        for r in step["grammar"]:
            i = ib.req_ids.index(r)
            constrained |= set(range(cu[i], cu[i + 1]))
        free = sorted(set(range(step["n_logits"])) - constrained)
        seen_trim += cu[-1] < step["n_logits"]
        assert torch.equal(ours[free], logits[free])
        assert torch.equal(ours, theirs)
    assert seen_trim > 20


def test_the_other_layout_would_differ():
    rng = random.Random(9)
    differing = 0
    for _ in range(100):
        step = v2_step(rng, 512, 3, LAYOUT)
        worker = make_worker(step["stride"], 512, max_num_logits=64)
        logits = torch.randn(step["n_logits"], 512)
        theirs, ours = logits.clone(), logits.clone()
        vllm_v2_apply(VLLM_METHOD, worker, theirs, step["input_batch"], step["grammar"],
                      step["bitmask"])
        try:
            apply_v2(worker, ours, step["input_batch"], step["grammar"], step["bitmask"], OTHER)
        except ValueError:  # row count of the other layout: refused, not applied
            differing += 1
            continue
        differing += not torch.equal(ours, theirs)
    assert differing > 20


def test_grammar_request_missing_from_batch_raises_like_vllm():
    rng = random.Random(1)
    step = v2_step(rng, 256, 1, LAYOUT)
    worker = make_worker(step["stride"], 256, max_num_logits=64)
    grammar = [*step["grammar"], "not-in-batch"]
    bitmask = np.zeros((step["bitmask"].shape[0] + step["stride"], 8), np.int32)
    with pytest.raises(KeyError, match="not-in-batch"):
        apply_v2(worker, torch.zeros(step["n_logits"], 256), step["input_batch"], grammar,
                 bitmask, LAYOUT)


def test_row_count_mismatch_is_a_clear_error():
    rng = random.Random(2)
    step = v2_step(rng, 256, 1, LAYOUT)
    worker = make_worker(step["stride"], 256, max_num_logits=64)
    with pytest.raises(ValueError, match=r"sent \d+ grammar bitmask rows"):
        apply_v2(worker, torch.zeros(step["n_logits"], 256), step["input_batch"],
                 step["grammar"], step["bitmask"][:-1], LAYOUT)


def test_device_path_matches_host_path():
    """The sync-free path (rows computed from the device ``cu_num_logits``) run on CPU
    tensors: the same logits as the host path."""
    from portable_guided.integrations.vllm import v2
    from portable_guided.integrations.vllm.rows import v2_keys

    rng = random.Random(4)
    for _ in range(200):
        layout = rng.choice([LAYOUT, OTHER])
        step = v2_step(rng, 300, rng.choice([0, 1, 3]), layout)
        worker = make_worker(step["stride"], 300, max_num_logits=64)
        ib = step["input_batch"]
        logits = torch.randn(step["n_logits"], 300)
        host, device = logits.clone(), logits.clone()
        apply_v2(worker, host, ib, step["grammar"], step["bitmask"], layout)
        positions = (None if layout == "block" else v2._positions(worker, ib))
        keys = v2_keys(ib.req_ids, step["grammar"], step["stride"], layout, positions)
        v2._apply_on_device(device, ib.cu_num_logits, keys, step["bitmask"], step["stride"])
        assert torch.equal(host, device)


def test_package_reference_matches_vllm():
    """The canary's fallback reference (used where vLLM's kernel cannot run) agrees with
    vLLM's own method."""
    from portable_guided.integrations.vllm.v2 import vllm_keys

    rng = random.Random(8)
    for _ in range(100):
        step = v2_step(rng, 700, rng.choice([0, 1, 3]), LAYOUT)
        worker = make_worker(step["stride"], 700, max_num_logits=64)
        logits = torch.randn(step["n_logits"], 700)
        theirs, ref = logits.clone(), logits.clone()
        vllm_v2_apply(VLLM_METHOD, worker, theirs, step["input_batch"], step["grammar"],
                      step["bitmask"])
        keys = vllm_keys(worker, step["input_batch"], step["grammar"], LAYOUT)
        guard.reference_v2_apply(ref, step["input_batch"].cu_num_logits, keys,
                                 step["bitmask"], step["stride"])
        assert torch.equal(ref, theirs)
