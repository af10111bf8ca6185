"""Version safety: fingerprints decide what is patched, the canary catches a wrong mask."""

from __future__ import annotations

import logging
from typing import Any

import pytest
import torch

from tests.sglang_plugin.support import plugin_loaded, pristine, random_bitmask, random_logits

ORIGINAL = pristine()


def test_known_fingerprints_match_installed_sglang() -> None:
    import sglang

    from portable_guided.integrations.sglang import guard

    found = guard.current(sglang.__version__)
    assert sglang.__version__ == "0.5.23"
    assert found.values == guard.KNOWN["0.5.23"]
    assert all(guard.match(found, hook) for hook in guard.HOOK_FUNCTIONS)


def test_changed_function_is_left_to_sglang(monkeypatch: pytest.MonkeyPatch,
                                            caplog: pytest.LogCaptureFixture) -> None:
    from sglang.srt.constrained.llguidance_backend import GuidanceGrammar

    from portable_guided.integrations import sglang as plugin
    from portable_guided.integrations.sglang import guard

    known = dict(guard.KNOWN["0.5.23"], llg_grammar_apply="0" * 16)
    monkeypatch.setitem(guard.KNOWN, "0.5.23", known)
    caplog.set_level(logging.INFO, logger="sglang.plugins.portable_guided")
    with plugin_loaded(monkeypatch):
        assert plugin.taken_over() == {"xgrammar": "verified", "xgrammar_static": "verified",
                                       "outlines": "verified"}
        assert GuidanceGrammar.__dict__["apply_vocab_mask"].__func__ is ORIGINAL["llguidance"]
    warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any("GuidanceGrammar.apply_vocab_mask differs" in m for m in warned)
    # ``force`` patches it anyway, loudly.
    caplog.clear()
    with plugin_loaded(monkeypatch, setting="force"):
        assert plugin.taken_over()["llguidance"] == "forced"
    assert any("Masks may be WRONG" in r.getMessage() for r in caplog.records)


def test_unknown_version_is_left_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    import sglang

    from portable_guided.integrations import sglang as plugin

    monkeypatch.setattr(sglang, "__version__", "0.5.99")
    with plugin_loaded(monkeypatch):
        assert plugin.taken_over() == {} and not plugin.is_patched()


@pytest.mark.parametrize("hook", ["xgrammar", "llguidance"])
def test_canary_keeps_sglang_result_and_restores(monkeypatch: pytest.MonkeyPatch,
                                                 caplog: pytest.LogCaptureFixture,
                                                 hook: str) -> None:
    """A wrong mask from our side (injected) is caught on the first call: SGLang's logits
    for that batch, SGLang's function back for the rest of the process."""
    from sglang.srt.constrained.llguidance_backend import GuidanceGrammar
    from sglang.srt.constrained.xgrammar_backend import XGrammarGrammar

    from portable_guided.integrations import sglang as plugin
    from portable_guided.integrations.sglang import apply

    name = {"xgrammar": "apply_xgrammar", "llguidance": "apply_llguidance"}[hook]
    right = getattr(apply, name)

    def wrong(logits: Any, vocab_mask: Any) -> None:
        right(logits, vocab_mask)
        logits[0, 0] = float("-inf")  # one token blocked that the grammar allows

    logits = random_logits(3, 640, torch.float32, seed=11)
    logits[0, 0] = 5.0
    mask = random_bitmask(3, 20, 0.5, seed=11)
    mask[0, 0] |= 1  # token 0 allowed in row 0
    expected = logits.clone()
    if hook == "xgrammar":
        ORIGINAL["xgrammar"](None, logits=expected, vocab_mask=mask)
    else:
        ORIGINAL["llguidance"](logits=expected, vocab_mask=mask)
    caplog.set_level(logging.ERROR, logger="sglang.plugins.portable_guided")
    with plugin_loaded(monkeypatch):
        monkeypatch.setattr(apply, name, wrong)
        call = ((lambda **kw: XGrammarGrammar.apply_vocab_mask(None, **kw))
                if hook == "xgrammar" else GuidanceGrammar.apply_vocab_mask)
        out = logits.clone()
        call(logits=out, vocab_mask=mask)
        assert torch.equal(out, expected)
        assert hook not in plugin.taken_over()
        restored = (XGrammarGrammar if hook == "xgrammar" else GuidanceGrammar
                    ).__dict__["apply_vocab_mask"]
        assert getattr(restored, "__func__", restored) is ORIGINAL[hook]
    assert any("differs from SGLang's on 1 logits (rows [0])" in r.getMessage()
               for r in caplog.records)


def test_sglangs_own_function_raising_restores_it_and_propagates(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    """SGLang's error on a checked call is SGLang's behaviour: it reaches the caller, with
    SGLang's function back in place and the logits untouched by ours."""
    from sglang.srt.constrained import llguidance_backend
    from sglang.srt.constrained.llguidance_backend import GuidanceGrammar

    from portable_guided.integrations import sglang as plugin

    def raising(*args: Any, **kwargs: Any) -> None:
        raise RuntimeError("SGLang's own failure")

    caplog.set_level(logging.ERROR, logger="sglang.plugins.portable_guided")
    with plugin_loaded(monkeypatch):
        monkeypatch.setattr(llguidance_backend, "apply_token_bitmask_inplace", raising)
        logits = random_logits(2, 640, torch.float32, seed=3)
        before = logits.clone()
        with pytest.raises(RuntimeError, match="SGLang's own failure"):
            GuidanceGrammar.apply_vocab_mask(logits=logits,
                                             vocab_mask=random_bitmask(2, 20, 0.5, seed=3))
        assert torch.equal(logits, before)
        assert "llguidance" not in plugin.taken_over() and "xgrammar" in plugin.taken_over()
        restored = GuidanceGrammar.__dict__["apply_vocab_mask"]
        assert getattr(restored, "__func__", restored) is ORIGINAL["llguidance"]
    (error,) = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert "llguidance apply_vocab_mask was not compared: SGLang's own function raised" in error
    assert "(device cpu, torch.float32, 2-D, logits wider than mask: False)" in error
