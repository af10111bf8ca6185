"""Operators see compile time-outs, engine fallbacks and rejected tokens in the log."""

from __future__ import annotations

import logging

from test_compile_service import nested_any_of

from portable_guided.runtime import GrammarRuntime, GrammarSpec


def test_fallback_and_rejection_are_logged(deepseek, caplog):
    caplog.set_level(logging.INFO, logger="portable_guided")
    spec = GrammarSpec.json_schema({"type": "object",
                                    "propertyNames": {"type": "string", "maxLength": 3}})
    with GrammarRuntime(deepseek, "auto", compile_timeout_s=None) as rt:
        req = rt.new_request(spec, on_error="reject").wait(60)
        assert req.engine_name == "xgrammar"
        assert not req.accept(deepseek.encode("x")[0])
    messages = [(r.levelname, r.name, r.getMessage()) for r in caplog.records]
    failed = [m for m in messages if "did not compile" in m[2]]
    assert len(failed) == 1 and failed[0][0] == "INFO" and "[llguidance]" in failed[0][2]
    assert "propertyNames" in failed[0][2]
    assert any(m[0] == "INFO" and "falling back to engine xgrammar" in m[2] for m in messages)
    rejected = [m for m in messages if "grammar rejected a token" in m[2]]
    assert len(rejected) == 1 and "on_error=reject" in rejected[0][2]
    assert rejected[0][1] == "portable_guided.runtime.request"


def test_timeout_is_a_warning(deepseek, caplog):
    caplog.set_level(logging.WARNING, logger="portable_guided")
    with GrammarRuntime(deepseek, "xgrammar", compile_timeout_s=1.0) as rt:
        req = rt.new_request(GrammarSpec.json_schema(nested_any_of(12))).wait(120)
        assert req.failed
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING
                and "did not compile" in r.getMessage()]
    assert len(warnings) == 1
    assert "exceeded its time limit of 1 s" in warnings[0].getMessage()
