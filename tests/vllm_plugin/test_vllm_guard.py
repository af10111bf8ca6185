"""Fingerprints decide what is taken over; the canary catches a wrong mapping before it
reaches the logits. In process: ``register()`` and ``unpatch()`` are called around each test."""

from __future__ import annotations

import logging
import random
from collections.abc import Iterator
from types import SimpleNamespace

import pytest
import torch
import vllm
from vllm.v1.core.sched.output import GrammarOutput
from vllm.v1.structured_output import utils as vllm_utils
from vllm.v1.worker.gpu import structured_outputs as v2_module

import portable_guided.integrations.vllm as plug
from portable_guided.integrations.vllm import apply as apply_mod
from portable_guided.integrations.vllm import guard
from portable_guided.integrations.vllm import v2 as v2_mod
from portable_guided.integrations.vllm.rows import v1_rows, v2_rows

from .reference import KernelTransliteration, cpu_streams, make_worker, v1_step, v2_step

VERSION = str(vllm.__version__)
VLLM_V1 = vllm_utils.apply_grammar_bitmask
VLLM_V2 = v2_module.StructuredOutputsWorker.apply_grammar_bitmask
LAYOUT = guard.layout_for_version(VERSION)


class Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)

    def at(self, level: int) -> list[str]:
        return [r.getMessage() for r in self.records if r.levelno == level]


@pytest.fixture
def log(monkeypatch) -> Iterator[Records]:
    """The plugin's log lines (vLLM's logger does not propagate to pytest's)."""
    monkeypatch.setenv(plug.ENV_ENABLE, "1")
    monkeypatch.delenv(plug.ENV_BACKEND, raising=False)
    plug.unpatch()
    handler = Records()
    logger = logging.getLogger("vllm.plugins.portable_guided")
    logger.addHandler(handler)
    old_level = logger.level
    logger.setLevel(logging.DEBUG)
    try:
        yield handler
    finally:
        logger.removeHandler(handler)
        logger.setLevel(old_level)
        plug.unpatch()
        assert vllm_utils.apply_grammar_bitmask is VLLM_V1
        assert v2_module.StructuredOutputsWorker.apply_grammar_bitmask is VLLM_V2


def test_known_fingerprints_match_installed_vllm():
    found = guard.current(VERSION)
    assert found.values == guard.KNOWN[VERSION]
    assert guard.match(found, "v1") == guard.match(found, "v2") == (VERSION, LAYOUT)


def test_fingerprints_recognised_both_runners_taken_over(log):
    plug.register()
    assert plug.taken_over() == {"v1": VERSION, "v2": VERSION}
    infos = [m for m in log.at(logging.INFO) if "took over" in m]
    assert len(infos) == 2
    assert any("Model Runner V1" in m for m in infos) and any("Model Runner V2" in m for m in infos)
    assert not log.at(logging.WARNING)
    assert vllm_utils.apply_grammar_bitmask is apply_mod.apply_grammar_bitmask
    assert v2_module.StructuredOutputsWorker.apply_grammar_bitmask is v2_mod.apply_grammar_bitmask


def test_unknown_fingerprint_is_left_alone_with_one_warning(log, monkeypatch):
    monkeypatch.setitem(guard.KNOWN, VERSION, {**guard.KNOWN[VERSION], "v2_apply": "0" * 16})
    plug.register()
    assert plug.taken_over() == {"v1": VERSION}
    assert v2_module.StructuredOutputsWorker.apply_grammar_bitmask is VLLM_V2
    warnings = log.at(logging.WARNING)
    assert len(warnings) == 1 and "Model Runner V2" in warnings[0] and "v2_apply" in warnings[0]
    assert "force" in warnings[0]
    # An uncovered V2 runner says so when it starts.
    make_worker(2, 64, 8)
    assert any("Model Runner V2 is active and portable_guided does not cover it" in m
               for m in log.at(logging.WARNING))


def test_unknown_version_is_left_alone_and_force_patches_loudly(log, monkeypatch):
    monkeypatch.setattr(vllm, "__version__", "0.99.0")
    plug.register()
    assert plug.taken_over() == {}
    (warning,) = log.at(logging.WARNING)
    assert "vLLM 0.99.0 is not a verified build" in warning
    plug.unpatch()
    monkeypatch.setenv(plug.ENV_ENABLE, "force")
    plug.register()
    assert plug.taken_over() == {"v1": "forced", "v2": "forced"}
    loud = [m for m in log.at(logging.WARNING) if m.startswith("PORTABLE_GUIDED_VLLM=force")]
    assert len(loud) == 2 and all("Masks may be WRONG" in m for m in loud)
    assert all("block bitmask layout" in m for m in loud)  # 0.99 >= 0.33


# --- the canary, V1 ---------------------------------------------------------------------


def _v1_call(step):
    scheduler_output = SimpleNamespace(scheduled_spec_decode_tokens=step["spec_tokens"])
    grammar_output = GrammarOutput(step["structured"], step["bitmask"],
                                   [0] * len(step["structured"]))
    input_batch = SimpleNamespace(req_ids=step["batch"])
    logits = torch.randn(step["n_logits"], step["bitmask"].shape[1] * 32)
    expected = logits.clone()
    VLLM_V1(scheduler_output, grammar_output, input_batch, expected)
    # As the model runner calls it: the name in vLLM's module, whatever is installed there.
    vllm_utils.apply_grammar_bitmask(scheduler_output, grammar_output, input_batch, logits)
    return logits, expected


def _ignore_spec_tokens(batch, structured, spec_tokens, n_rows, layout):
    """Planted bug: the speculative rows are forgotten (the plugin before speculation)."""
    return v1_rows(batch, structured, {}, n_rows, layout)


def _speculative_steps(rng, layout, n_plain):
    steps = [v1_step(rng, 256, 0, layout) for _ in range(n_plain)]
    while True:  # a step whose structured requests have drafts: the bug shows there
        step = v1_step(rng, 256, 3, layout)
        if any(step["spec_tokens"].get(r) for r in step["structured"] if r in step["batch"]):
            return [*steps, step, *[v1_step(rng, 256, 3, layout) for _ in range(5)]]


@pytest.mark.parametrize("trial", range(25))
def test_canary_catches_planted_v1_bug_and_no_wrong_mask_reaches_logits(log, monkeypatch, trial):
    monkeypatch.setattr(apply_mod, "v1_rows", _ignore_spec_tokens)
    plug.register()
    rng = random.Random(f"v1-{trial}")
    for step in _speculative_steps(rng, LAYOUT, n_plain=rng.randint(1, 4)):
        logits, expected = _v1_call(step)
        assert torch.equal(logits, expected)  # every batch got vLLM's mask
    errors = log.at(logging.ERROR)
    assert len(errors) == 1 and "differs from vLLM's" in errors[0]
    assert "v1" not in plug.taken_over() and vllm_utils.apply_grammar_bitmask is VLLM_V1
    assert "v2" in plug.taken_over()  # the other runner is not concerned


def test_canary_checks_each_kind_once_then_stays_out_of_the_way(log):
    plug.register()
    takeover = apply_mod.TAKEOVER
    rng = random.Random(0)
    for _ in range(60):
        logits, expected = _v1_call(v1_step(rng, 256, rng.choice([0, 3]), LAYOUT))
        assert torch.equal(logits, expected)
    assert takeover.canary.seen == {"first", "speculative", "unconstrained"}
    assert 1 <= takeover.canary.checks <= 3 and not log.at(logging.ERROR)
    assert plug.taken_over()["v1"] == VERSION


def test_vllms_own_function_raising_restores_it_and_propagates(log, monkeypatch):
    """vLLM's error on a checked call is vLLM's behaviour: it reaches the caller, with vLLM's
    function back in place (the plugin is out of the way for the rest of the process)."""
    plug.register()

    def raising(*args, **kwargs):
        raise RuntimeError("vLLM's own failure")

    # vLLM's own V1 apply ends in xgrammar's kernel: make that fail.
    monkeypatch.setattr(vllm_utils, "xgr", SimpleNamespace(apply_token_bitmask_inplace=raising))
    step = v1_step(random.Random(1), 256, 0, LAYOUT)
    grammar_output = GrammarOutput(step["structured"], step["bitmask"],
                                   [0] * len(step["structured"]))
    logits = torch.randn(step["n_logits"], step["bitmask"].shape[1] * 32)
    before = logits.clone()
    with pytest.raises(RuntimeError, match="vLLM's own failure"):
        vllm_utils.apply_grammar_bitmask(
            SimpleNamespace(scheduled_spec_decode_tokens=step["spec_tokens"]), grammar_output,
            SimpleNamespace(req_ids=step["batch"]), logits)
    assert torch.equal(logits, before)  # ours did not run on them
    (error,) = log.at(logging.ERROR)
    assert "V1 grammar bitmask was not compared: vLLM's own function raised" in error
    assert "v1" not in plug.taken_over() and vllm_utils.apply_grammar_bitmask is VLLM_V1
    assert "v2" in plug.taken_over()  # the other runner is not concerned


# --- the canary, V2 ---------------------------------------------------------------------


def _shift_drafts(keys, mask_stride, cu_num_logits):
    """Planted bug: draft positions land one row early (an off-by-one in the row index)."""
    bitmask_rows, logits_rows = v2_rows(keys, mask_stride, cu_num_logits)
    position = keys[bitmask_rows] % mask_stride
    return bitmask_rows, logits_rows - (position > 0)


def _swap_first_two(keys, mask_stride, cu_num_logits):
    """Planted bug: positions 0 and 1 of a request trade rows (no duplicate rows, so only a
    comparison of masks can see it)."""
    bitmask_rows, logits_rows = v2_rows(keys, mask_stride, cu_num_logits)
    req_idx, position = divmod(keys[bitmask_rows], mask_stride)
    has_second = set(req_idx[position == 1].tolist())
    swapped = logits_rows.copy()
    for i, (req, pos) in enumerate(zip(req_idx.tolist(), position.tolist())):
        if pos == 1:
            swapped[i] -= 1
        elif pos == 0 and req in has_second:
            swapped[i] += 1
    return bitmask_rows, swapped


def _v2_call(step, worker, vllm_kernel):
    logits = torch.randn(step["n_logits"], step["bitmask"].shape[1] * 32)
    expected = logits.clone()
    args = (step["input_batch"], step["grammar"], step["bitmask"])
    with cpu_streams():
        saved = v2_module._apply_grammar_bitmask_kernel
        v2_module._apply_grammar_bitmask_kernel = KernelTransliteration()
        try:
            VLLM_V2(worker, expected, *args)
            if not vllm_kernel:  # the canary falls back to the package's reference
                v2_module._apply_grammar_bitmask_kernel = saved
                with pytest.MonkeyPatch.context() as mp:
                    mp.setattr(torch.cuda, "stream", _no_cuda)
                    worker.apply_grammar_bitmask(logits, *args)
            else:
                worker.apply_grammar_bitmask(logits, *args)
        finally:
            v2_module._apply_grammar_bitmask_kernel = saved
    return logits, expected


def _no_cuda(*args, **kwargs):
    raise RuntimeError("no CUDA here")


@pytest.mark.parametrize("bug", [_swap_first_two, _shift_drafts], ids=["swap", "shift"])
@pytest.mark.parametrize("vllm_kernel", [True, False], ids=["vllm-method", "reference"])
@pytest.mark.parametrize("trial", range(10))
def test_canary_catches_planted_v2_bug(log, monkeypatch, trial, vllm_kernel, bug):
    monkeypatch.setattr(v2_mod, "v2_rows", bug)
    v2_mod._reference_logged.clear()
    plug.register()
    rng = random.Random(f"v2-{trial}")
    steps = [v2_step(rng, 256, 0, LAYOUT) for _ in range(rng.randint(1, 3))]
    while True:
        step = v2_step(rng, 256, 3, LAYOUT)
        ib = step["input_batch"]
        cu = ib.cu_num_logits.numpy()
        if ib.num_draft_tokens and any(cu[ib.req_ids.index(r) + 1] - cu[ib.req_ids.index(r)] > 1
                                       for r in step["grammar"]):
            break
    steps += [step, *[v2_step(rng, 256, 3, LAYOUT) for _ in range(4)]]
    for step in steps:
        if "v2" not in plug.taken_over() and not vllm_kernel:
            break  # restored: vLLM's own method runs now, and on this CPU it cannot
        worker = make_worker(step["stride"], 256, max_num_logits=64)
        logits, expected = _v2_call(step, worker, vllm_kernel)
        assert torch.equal(logits, expected)  # every batch got vLLM's mask
    errors = log.at(logging.ERROR)
    assert len(errors) == 1 and "V2 grammar bitmask" in errors[0]
    # the swap is seen by comparing masks; the shift makes duplicate rows, which ours refuses
    assert ("differs from vLLM's" if bug is _swap_first_two else "raised ValueError") in errors[0]
    assert "v2" not in plug.taken_over()
    assert v2_module.StructuredOutputsWorker.apply_grammar_bitmask is VLLM_V2
    if not vllm_kernel:
        assert any("compares with a transliteration" in m for m in log.at(logging.INFO))
