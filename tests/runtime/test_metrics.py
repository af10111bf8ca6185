"""Metrics: monotonic totals beside the windows, and the Prometheus export (scraped over HTTP)."""

from __future__ import annotations

import urllib.request

import pytest

from portable_guided.runtime import GrammarRuntime, GrammarSpec, Metrics


def test_totals_are_monotonic_and_windows_bounded():
    m = Metrics(window=4)
    samples = [0.001 * (i + 1) for i in range(10)]
    for s in samples:
        m.observe("compile", s)
    for i in range(7):
        m.record_fill(rows=3, seconds=0.5)
    snap = m.snapshot()
    assert snap["compile_count"] == 10 and snap["compile_window"] == 4
    assert snap["compile_seconds_total"] == sum(samples)
    # Percentiles over the last 4 samples only (7, 8, 9, 10 ms): nearest rank.
    assert snap["compile_ms_p50"] == pytest.approx(9.0)
    assert snap["compile_ms_mean"] == pytest.approx(8.5)
    assert (snap["fill_count"], snap["fill_steps"], snap["fill_rows"]) == (7, 7, 21)
    assert snap["fill_seconds_total"] == 3.5 and snap["fill_window"] == 4
    assert snap["compile_wait_count"] == 0  # every timing is reported before its first sample
    with pytest.raises(ValueError, match="window must be an int >= 1, got 0"):
        Metrics(window=0)


def test_runtime_fill_count_is_a_total_past_the_window(deepseek):
    rt = GrammarRuntime(deepseek, "llguidance", compile_timeout_s=None)
    try:
        req = rt.new_request(GrammarSpec.regex(r"[a-z]+")).wait(60)
        bm = rt.allocate_bitmask(1)
        for _ in range(5000):
            rt.fill_bitmask([req], bm)
        m = rt.metrics()
    finally:
        rt.close()
    assert m["fill_count"] == m["fill_steps"] == 5000  # was the window's length, 4096
    assert m["fill_window"] == 4096


def test_prometheus_scrape_over_http(deepseek):
    prometheus_client = pytest.importorskip("prometheus_client")
    from prometheus_client.parser import text_string_to_metric_families

    from portable_guided.runtime import register_prometheus

    registry = prometheus_client.CollectorRegistry()
    rt = GrammarRuntime(deepseek, "xgrammar", compile_timeout_s=None)
    server = None
    try:
        collector = register_prometheus(rt, registry=registry, labels={"model": "deepseek"})
        req = rt.new_request(GrammarSpec.json_schema(
            {"type": "object", "properties": {"a": {"type": "integer"}}}),
            on_error="reject").wait(60)
        bm = rt.allocate_bitmask(2)
        tokens = deepseek.encode('{"a": 12}')
        for t in tokens:
            rt.fill_bitmask([req, None], bm)
            assert req.accept(t)
        assert not req.accept(deepseek.encode("x")[0])  # rejected: fails closed
        server, _thread = prometheus_client.start_http_server(0, addr="127.0.0.1",
                                                              registry=registry)
        url = f"http://127.0.0.1:{server.server_port}/metrics"
        with urllib.request.urlopen(url, timeout=30) as reply:
            text = reply.read().decode()
        snap = rt.metrics()
    finally:
        if server is not None:
            server.shutdown()
        rt.close()
    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value
               for fam in text_string_to_metric_families(text) for s in fam.samples}
    label = (("model", "deepseek"),)

    def value(name, extra=()):
        return samples[(name, tuple(sorted(label + extra)))]

    assert value("portable_guided_tokens_accepted_total") == len(tokens)
    assert value("portable_guided_tokens_rejected_total") == 1
    assert value("portable_guided_requests_total") == 1
    assert value("portable_guided_fill_steps_total") == len(tokens)
    assert value("portable_guided_fill_rows_total") == 2 * len(tokens)  # the None row counts
    assert value("portable_guided_fill_seconds_count") == len(tokens)
    assert value("portable_guided_fill_seconds_sum") == pytest.approx(snap["fill_seconds_total"])
    assert value("portable_guided_compile_seconds_count") == snap["compile_count"] == 1
    p50 = value("portable_guided_fill_window_seconds", (("quantile", "0.5"),))
    assert p50 == pytest.approx(snap["fill_ms_p50"] / 1e3)
    assert value("portable_guided_cache_entries") == 1
    assert value("portable_guided_cache_bytes") == snap["cache_bytes"] > 0
    registry.unregister(collector)
    assert "portable_guided" not in prometheus_client.generate_latest(registry).decode()
