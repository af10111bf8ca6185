"""Version safety: fingerprints decide what is patched, the canary catches a wrong mask."""

from __future__ import annotations

import logging
from typing import Any

import pytest
import torch

from tests.lmdeploy_plugin.support import (
    bare_manager,
    lmdeploy_apply,
    plugin_loaded,
    random_bitmask,
    reference_mask,
)

LOGGER = "lmdeploy.plugins.portable_guided"


def test_known_fingerprints_match_installed_lmdeploy() -> None:
    import lmdeploy

    from portable_guided.integrations.lmdeploy import guard

    assert lmdeploy.__version__ == "0.18.0"
    found = guard.current(lmdeploy.__version__)
    assert found.values == guard.KNOWN["0.18.0"]
    assert all(guard.GUARD.match(found, name) == "0.18.0" for name in guard.TAKEOVER_FUNCTIONS)


def test_lane_process_is_patched_by_the_pth_hook() -> None:
    """The lane installs the package (editable), so its .pth hook registered the plugin when
    lmdeploy's logits_process was first imported in this process."""
    import sys

    from lmdeploy.pytorch.engine import logits_process  # noqa: F401

    from portable_guided.integrations import lmdeploy as plugin

    assert "portable_guided_lmdeploy_hook" in sys.modules
    assert plugin.is_patched() and plugin.taken_over() == {"apply": "verified"}


def test_changed_function_is_left_to_lmdeploy(monkeypatch: pytest.MonkeyPatch,
                                              caplog: pytest.LogCaptureFixture) -> None:
    """One lmdeploy function the takeover relies on, changed (a newer build): not patched,
    one warning naming it; ``force`` patches it anyway, loudly."""
    from lmdeploy.pytorch.engine.logits_process import FusedLogitsProcessor

    from portable_guided.integrations import lmdeploy as plugin

    def _fill_guided_bitmask(self: Any, guided_bitmask: torch.Tensor) -> None:
        guided_bitmask.data.fill_(0)  # a build that fills differently
        for i, processor in self.guided_processors.items():
            self.guided_decoding_manager.fill_bitmap(processor, guided_bitmask, i)

    plugin.unpatch()
    monkeypatch.setattr(FusedLogitsProcessor, "_fill_guided_bitmask", _fill_guided_bitmask)
    caplog.set_level(logging.INFO, logger=LOGGER)
    with plugin_loaded(monkeypatch):
        assert plugin.taken_over() == {} and not plugin.is_patched()
    warned = [r.getMessage() for r in caplog.records
              if r.levelno == logging.WARNING and r.name == LOGGER]
    assert len(warned) == 1, warned
    assert "FusedLogitsProcessor._fill_guided_bitmask differs from the verified 0.18.0" in (
        warned[0])
    caplog.clear()
    with plugin_loaded(monkeypatch, setting="force"):
        assert plugin.taken_over() == {"apply": "forced"} and plugin.is_patched()
    assert any("Masks may be WRONG" in r.getMessage() for r in caplog.records)


def test_unknown_version_is_left_alone(monkeypatch: pytest.MonkeyPatch,
                                       caplog: pytest.LogCaptureFixture) -> None:
    import lmdeploy

    from portable_guided.integrations import lmdeploy as plugin

    monkeypatch.setattr(lmdeploy, "__version__", "0.18.1")
    caplog.set_level(logging.INFO, logger=LOGGER)
    with plugin_loaded(monkeypatch):
        assert plugin.taken_over() == {} and not plugin.is_patched()
    assert any("lmdeploy 0.18.1 is not a verified build" in r.getMessage()
               for r in caplog.records)


def test_disabled_registers_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    from portable_guided.integrations import lmdeploy as plugin

    with plugin_loaded(monkeypatch, setting="0"):
        assert plugin.taken_over() == {} and not plugin.is_patched()


def test_canary_catches_a_planted_row_bug(monkeypatch: pytest.MonkeyPatch,
                                          caplog: pytest.LogCaptureFixture) -> None:
    """A wrong row from our side (planted) is caught on the first call: lmdeploy's logits
    for that batch, one error, lmdeploy's function back for the rest of the process."""
    from lmdeploy.pytorch.engine.guided_process import GuidedDecodingManager

    from portable_guided.integrations import lmdeploy as plugin
    from portable_guided.integrations.lmdeploy import apply

    right = apply.apply_bitmap

    def wrong(logits: torch.Tensor, bitmask: torch.Tensor) -> None:
        right(logits, bitmask)
        logits[2] = right_row  # row 2 left unmasked: the planted bug

    caplog.set_level(logging.INFO, logger=LOGGER)
    with plugin_loaded(monkeypatch):
        monkeypatch.setattr(apply, "apply_bitmap", wrong)
        manager = bare_manager()
        logits = torch.randn(4, 300, generator=torch.Generator().manual_seed(3))
        right_row = logits[2].clone()
        bitmask = random_bitmask(4, 10, 0.5, seed=4)
        expected = reference_mask(logits, bitmask)
        manager.apply_batched_bitmap(logits, bitmask)
        assert torch.equal(logits, expected)  # lmdeploy's result for this batch
        assert not plugin.is_patched() and plugin.taken_over() == {}
        assert GuidedDecodingManager.__dict__["apply_batched_bitmap"] is lmdeploy_apply()
        errors = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
        assert len(errors) == 1 and "rows [2]" in errors[0], errors
        # Later calls are lmdeploy's own (the planted bug never runs again).
        again = torch.randn(4, 300)
        manager.apply_batched_bitmap(again, bitmask)
        assert torch.equal(again, reference_mask(again, bitmask))


def test_canary_checks_each_kind_once(monkeypatch: pytest.MonkeyPatch) -> None:
    from portable_guided.integrations.lmdeploy import apply

    with plugin_loaded(monkeypatch):
        canary = apply.TAKEOVER.canary
        manager = bare_manager()
        bitmask = random_bitmask(3, 4, 0.5, seed=1)
        for _ in range(3):
            manager.apply_batched_bitmap(torch.randn(3, 128), bitmask)
        assert canary.checks == 1
        manager.apply_batched_bitmap(torch.randn(3, 128, dtype=torch.bfloat16), bitmask)
        manager.apply_batched_bitmap(torch.randn(3, 160), bitmask)  # wider than the mask
        manager.apply_batched_bitmap(torch.randn(3, 2, 128)[:, 1, :], bitmask)  # strided
        assert canary.checks == 4 and not canary.tripped
