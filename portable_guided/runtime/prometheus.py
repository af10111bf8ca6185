"""Prometheus export of a runtime's metrics (needs ``pip install prometheus-client``, the
client vLLM and SGLang expose their metrics with).

>>> from portable_guided.runtime.prometheus import register_prometheus   # doctest: +SKIP
>>> register_prometheus(rt)            # then prometheus_client.start_http_server(8000)

Each scrape reads ``rt.metrics()`` once: counters become Prometheus counters
(``portable_guided_tokens_accepted_total``), each timing a summary of its monotonic count and
sum in seconds (``portable_guided_fill_seconds_count`` / ``_sum``) plus a gauge of the
window's quantiles (``portable_guided_fill_window_seconds{quantile="0.5"}``), and the memory
cache's size gauges. ``prometheus_client`` is imported only here.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

__all__ = ["RuntimeCollector", "register_prometheus"]

#: Snapshot keys that are levels, not totals.
GAUGES = {"cache_bytes": "bytes held by the compiled-grammar memory cache",
          "cache_entries": "compiled grammars in the memory cache"}


def _client() -> Any:
    try:
        import prometheus_client
    except ImportError as exc:
        raise ImportError("Prometheus export needs `pip install prometheus-client` "
                          "(or the `prometheus` extra of portable-guided)") from exc
    return prometheus_client


class RuntimeCollector:
    """A ``prometheus_client`` collector of one :class:`GrammarRuntime`'s metrics.

    ``labels`` are added to every sample (e.g. ``{"model": "qwen"}``); two runtimes in one
    registry need different ``prefix`` values (Prometheus names must be unique).
    """

    def __init__(self, runtime: Any, *, prefix: str = "portable_guided",
                 labels: Mapping[str, str] | None = None) -> None:
        if not prefix or not prefix.replace("_", "a").isalnum() or prefix[0].isdigit():
            raise ValueError(f"prefix must be a Prometheus name ([a-zA-Z_][a-zA-Z0-9_]*), "
                             f"got {prefix!r}")
        self._rt = runtime
        self._prefix = prefix
        self._labels = dict(labels or {})

    def describe(self) -> list[Any]:
        """No up-front description: the registry checks names by calling :meth:`collect`."""
        return list(self.collect())

    def collect(self) -> Iterator[Any]:
        """The metric families of one scrape."""
        from prometheus_client.core import (
            CounterMetricFamily,
            GaugeMetricFamily,
            SummaryMetricFamily,
        )

        snap = self._rt.metrics()
        keys, values = list(self._labels), list(self._labels.values())
        p = self._prefix
        for name in self._rt.metrics_sink.COUNTERS:
            c = CounterMetricFamily(f"{p}_{name}", f"portable_guided runtime: {name}",
                                    labels=keys)
            c.add_metric(values, snap[name])
            yield c
        for name in self._rt.metrics_sink.timing_names():
            s = SummaryMetricFamily(f"{p}_{name}_seconds", f"{name} time (all samples)",
                                    labels=keys)
            s.add_metric(values, count_value=snap[f"{name}_count"],
                         sum_value=snap[f"{name}_seconds_total"])
            yield s
            g = GaugeMetricFamily(f"{p}_{name}_window_seconds",
                                  f"{name} time quantiles over the latest samples",
                                  labels=[*keys, "quantile"])
            for q, key in (("0.5", "p50"), ("0.99", "p99")):
                g.add_metric([*values, q], snap[f"{name}_ms_{key}"] / 1e3)
            yield g
        for name, doc in GAUGES.items():
            g = GaugeMetricFamily(f"{p}_{name}", doc, labels=keys)
            g.add_metric(values, snap[name])
            yield g


def register_prometheus(runtime: Any, *, registry: Any = None, prefix: str = "portable_guided",
                        labels: Mapping[str, str] | None = None) -> RuntimeCollector:
    """Register a :class:`RuntimeCollector` for ``runtime`` in ``registry`` (default:
    ``prometheus_client.REGISTRY``, the one ``start_http_server`` and vLLM's ``/metrics``
    serve) and return it (``registry.unregister(collector)`` removes it)."""
    client = _client()
    collector = RuntimeCollector(runtime, prefix=prefix, labels=labels)
    (client.REGISTRY if registry is None else registry).register(collector)
    return collector
