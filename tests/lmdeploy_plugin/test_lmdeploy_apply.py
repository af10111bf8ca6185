"""Ours against lmdeploy's own ``apply_batched_bitmap`` (xgrammar's kernel) and an
independent NumPy reference: random batches in every dtype, rows without a grammar, logits
wider than the mask, and the speculative helper's strided views with real xgrammar matchers."""

from __future__ import annotations

import asyncio
import json
import warnings

import numpy as np
import pytest
import torch

from portable_guided.integrations.lmdeploy.apply import apply_bitmap
from tests.lmdeploy_plugin.support import (
    bare_manager,
    lmdeploy_apply,
    plugin_off,
    random_bitmask,
    reference_mask,
    tokenizer,
)

DTYPES = [torch.float32, torch.bfloat16, torch.float16]
STEPS = 1000


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d).split(".")[1])
def test_random_steps_match_lmdeploy(dtype: torch.dtype) -> None:
    """1,000 random steps per dtype: batch 1-16, vocabularies of 33-3,000 tokens (not a
    multiple of 32), a fifth of the rows unconstrained, a quarter of the steps with logits
    wider than the mask, a tenth of them a strided ``[:, pos, :]`` view. Zero differing
    masks against lmdeploy's own function, and both equal to the reference."""
    from portable_guided.integrations import lmdeploy as plugin

    assert plugin.is_patched()
    manager = bare_manager()
    theirs_fn = lmdeploy_apply()
    rng = np.random.default_rng(int(torch.finfo(dtype).bits))
    differing = mismatched = 0
    for step in range(STEPS):
        rows = int(rng.integers(1, 17))
        vocab = int(rng.integers(33, 3001))
        words = (vocab + 31) // 32
        width = vocab + (int(rng.integers(1, 200)) if rng.random() < 0.25 else 0)
        bitmask = random_bitmask(rows, words, float(rng.random()), seed=step,
                                 unconstrained=0.2, vocab=vocab)
        base = torch.from_numpy(rng.standard_normal((rows, 3, width), dtype=np.float32)) * 4
        base = base.to(dtype)
        strided = rng.random() < 0.1
        ours = base.clone()
        theirs = base.clone()
        ours_view = ours[:, 1, :] if strided else ours[:, 1, :].contiguous()
        theirs_view = theirs[:, 1, :].contiguous()
        manager.apply_batched_bitmap(ours_view, bitmask)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # xgrammar's note on a narrower mask
            theirs_fn(manager, theirs_view, bitmask)
        differing += not torch.equal(ours_view, theirs_view)
        mismatched += not torch.equal(ours_view, reference_mask(base[:, 1, :], bitmask))
        if strided:  # the other positions of the 3-D scores are untouched
            assert torch.equal(ours[:, 0], base[:, 0]) and torch.equal(ours[:, 2], base[:, 2])
    assert (differing, mismatched) == (0, 0)
    assert plugin.is_patched()  # the canary never tripped


def test_clear_padding_bits_stay_in_their_row() -> None:
    """Found by the parity test: with the bits past the logits' width clear (a bitmask
    wider than the logits), xgrammar 0.2.8's CPU kernel, which lmdeploy calls on CPU logits,
    writes ``-inf`` past the end of the row, into the next row (token ``width + j`` of row
    ``r`` lands on column ``j`` of row ``r + 1``). Ours, like the reference, masks only
    columns the logits have."""
    manager = bare_manager()
    logits = torch.randn(2, 40)
    bitmask = torch.full((2, 2), -1, dtype=torch.int32)
    bitmask[0, 1] = ~(1 << (45 - 32))  # row 0: token 45 blocked, past the 40 columns
    ours, theirs = logits.clone(), logits.clone()
    apply_bitmap(ours, bitmask)  # (not through the canary, which would side with lmdeploy)
    lmdeploy_apply()(manager, theirs, bitmask)
    assert torch.equal(ours, logits) and torch.equal(ours, reference_mask(logits, bitmask))
    assert (theirs != logits).nonzero().tolist() == [[1, 5]]  # xgrammar's stray write


def test_wider_logits_leave_the_extra_columns_without_a_warning() -> None:
    manager = bare_manager()
    logits = torch.randn(2, 100)
    before = logits.clone()
    bitmask = torch.zeros(2, 2, dtype=torch.int32)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        manager.apply_batched_bitmap(logits, bitmask)
    assert torch.isinf(logits[:, :64]).all() and torch.equal(logits[:, 64:], before[:, 64:])


def test_bad_input_raises_with_the_values() -> None:
    manager = bare_manager()
    with pytest.raises(ValueError, match=r"3.*2|2.*3"):
        # (the canary has seen this kind already: our own check raises)
        manager.apply_batched_bitmap(torch.randn(3, 64), torch.zeros(2, 2, dtype=torch.int32))


SCHEMA = {"type": "object", "properties": {"name": {"type": "string"},
                                           "age": {"type": "integer"}},
          "required": ["name", "age"]}


@pytest.fixture(scope="module")
def manager():
    """A real ``GuidedDecodingManager`` on the real SmolLM2 tokenizer."""
    from lmdeploy.pytorch.engine.guided_process import GuidedDecodingManager

    return GuidedDecodingManager(tokenizer(), 49152)


def _serial(manager, seed: int, dtype: torch.dtype) -> torch.Tensor:
    """lmdeploy's real ``GuidedSpecHelper.apply_serial_bitmask`` on ``[B, 4, V]`` scores:
    forked xgrammar matchers, a bitmask per position applied to the strided view."""
    from lmdeploy.pytorch.spec_decode.guided_spec_helper import GuidedSpecHelper

    tok = tokenizer()
    helper = GuidedSpecHelper(manager)
    fmt = {"type": "json_schema", "json_schema": {"name": "p", "schema": SCHEMA}}
    session_ctx = [{"session_id": 1000 + seed * 10 + i, "seq_id": i} for i in range(3)]
    processors = helper.get_processors(session_ctx, [fmt, {"type": "text"}, fmt])
    draft_text = '{"name": "Ann'
    drafts = tok.encode(draft_text, add_special_tokens=False)[:3]
    draft_ids = torch.tensor([drafts] * 3)
    scores = torch.randn(3, 4, 49152, generator=torch.Generator().manual_seed(seed)).to(dtype)
    asyncio.run(helper.apply_serial_bitmask(scores, processors, draft_ids, 3))
    for i in range(3):
        manager.remove_processor(1000 + seed * 10 + i)
    return scores


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d).split(".")[1])
def test_speculative_serial_bitmask_matches_lmdeploy(manager, dtype: torch.dtype) -> None:
    from portable_guided.integrations import lmdeploy as plugin

    assert plugin.is_patched()
    ours = _serial(manager, 1, dtype)
    with plugin_off():
        theirs = _serial(manager, 1, dtype)
    assert torch.equal(ours, theirs)
    # Row 1 has no grammar: untouched; rows 0 and 2 masked at every position, the first
    # position allowing only the schema's opening ("{", '{"').
    assert not torch.isinf(ours[1]).any()
    allowed = (~torch.isinf(ours[0, 0])).nonzero().flatten().tolist()
    assert sorted(tokenizer().decode([t]) for t in allowed) == ["{", '{"']
    assert torch.isinf(ours[0]).any(dim=-1).all()


def test_speculative_apply_bitmask_matches_lmdeploy(manager) -> None:
    """``GuidedSpecHelper.apply_bitmask`` on draft logits (a full ``[B, V]`` batch)."""
    from lmdeploy.pytorch.spec_decode.guided_spec_helper import GuidedSpecHelper

    helper = GuidedSpecHelper(manager)
    fmt = {"type": "json_schema", "json_schema": {"name": "p", "schema": SCHEMA}}
    processors = helper.get_processors([{"session_id": 7, "seq_id": 0},
                                        {"session_id": 8, "seq_id": 0}], [fmt, fmt])
    logits = torch.randn(2, 49152, dtype=torch.bfloat16)
    bitmask = asyncio.run(helper.prepare_bitmask(logits, processors))
    ours, theirs = logits.clone(), logits.clone()
    helper.apply_bitmask(ours, bitmask)
    with plugin_off():
        helper.apply_bitmask(theirs, bitmask)
    assert torch.equal(ours, theirs) and torch.equal(ours, reference_mask(logits, bitmask))
    manager.remove_processor(7)
    manager.remove_processor(8)
    assert json.dumps(SCHEMA)  # (the schema the matchers were compiled from)
