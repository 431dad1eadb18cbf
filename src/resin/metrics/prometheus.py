"""Prometheus text exposition of an engine's metrics (`prometheus_client`, imported lazily).

```python
exporter = PrometheusExporter(engine, model_name="smollm2")
body: bytes = exporter.render()        # serve with exporter.content_type at /metrics
```

Names carry the `resin:` prefix and mirror vLLM's (see SERVING.md); counters get the
`_total` suffix from the exposition format; histogram buckets are those in `collector.py`.
The exporter reads one `MetricsSnapshot` per render, so it never blocks the engine for long.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from resin.metrics.collector import HistogramSnapshot, MetricsSnapshot

if TYPE_CHECKING:
    from resin.engine.engine import Engine

PREFIX = "resin:"


class PrometheusExporter:
    """Renders an engine's metrics snapshot in the Prometheus text format."""

    content_type = "text/plain; version=0.0.4; charset=utf-8"

    def __init__(
        self,
        source: Engine | Callable[[], MetricsSnapshot | None],
        model_name: str | None = None,
    ) -> None:
        self._snapshot = source if callable(source) else (lambda: source.metrics)
        self._labels = {} if model_name is None else {"model_name": model_name}

    def render(self) -> bytes:
        from prometheus_client import CollectorRegistry, generate_latest

        registry = CollectorRegistry(auto_describe=False)
        registry.register(_Collector(self._snapshot, self._labels))
        return bytes(generate_latest(registry))


class _Collector:
    def __init__(
        self, snapshot: Callable[[], MetricsSnapshot | None], labels: dict[str, str]
    ) -> None:
        self._snapshot = snapshot
        self._labels = labels

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import (
            CounterMetricFamily,
            GaugeMetricFamily,
            HistogramMetricFamily,
            SummaryMetricFamily,
        )

        snap = self._snapshot()
        if snap is None:
            return
        names, values = list(self._labels), list(self._labels.values())

        def gauge(name: str, doc: str, value: float) -> Any:
            g = GaugeMetricFamily(PREFIX + name, doc, labels=names)
            g.add_metric(values, value)
            return g

        def counter(name: str, doc: str, value: float) -> Any:
            c = CounterMetricFamily(PREFIX + name, doc, labels=names)
            c.add_metric(values, value)
            return c

        def histogram(name: str, doc: str, h: HistogramSnapshot) -> Any:
            m = HistogramMetricFamily(PREFIX + name, doc, labels=names)
            cumulative, buckets = 0, []
            for bound, count in zip([*h.buckets, float("inf")], h.counts, strict=True):
                cumulative += count
                buckets.append((_le(bound), cumulative))
            m.add_metric(values, buckets, h.total)
            return m

        yield gauge("num_requests_running", "Requests admitted (prefill or decode).",
                    snap.num_requests_running)  # fmt: skip
        yield gauge("num_requests_waiting", "Requests queued.", snap.num_requests_waiting)
        yield gauge("kv_cache_usage_perc",
                    "Fraction of cache pages held by live requests (0-1; evictable "
                    "prefix-cache pages excluded).", snap.kv_cache_usage_perc)  # fmt: skip
        yield gauge("prefix_cache_usage_perc",
                    "Fraction of cache pages held only by the prefix cache (evictable, 0-1).",
                    snap.prefix_cache_usage_perc)  # fmt: skip
        yield counter("prefix_cache_queries", "Prompt tokens looked up in the prefix cache.",
                      snap.prefix_cache_queries)  # fmt: skip
        yield counter("prefix_cache_hits", "Prompt tokens served by the prefix cache.",
                      snap.prefix_cache_hits)  # fmt: skip
        yield counter("num_preemptions", "Retractions (preempt + recompute).",
                      snap.num_preemptions)  # fmt: skip
        yield counter("prompt_tokens", "Prompt tokens of requests that started generating.",
                      snap.prompt_tokens)  # fmt: skip
        yield counter("generation_tokens", "Generated tokens.", snap.generation_tokens)
        success = CounterMetricFamily(
            PREFIX + "request_success", "Finished requests by reason.",
            labels=[*names, "finished_reason"],
        )  # fmt: skip
        for reason, count in snap.request_success:
            success.add_metric([*values, reason], count)
        yield success
        yield histogram("time_to_first_token_seconds", "Time to first token.",
                        snap.time_to_first_token_seconds)  # fmt: skip
        yield histogram("inter_token_latency_seconds", "Time between consecutive tokens.",
                        snap.inter_token_latency_seconds)  # fmt: skip
        yield histogram("e2e_request_latency_seconds", "Submit to finish.",
                        snap.e2e_request_latency_seconds)  # fmt: skip
        yield histogram("request_queue_time_seconds", "Submit to first admission.",
                        snap.request_queue_time_seconds)  # fmt: skip
        yield histogram("request_prefill_time_seconds", "First admission to first token.",
                        snap.request_prefill_time_seconds)  # fmt: skip
        yield histogram("request_decode_time_seconds", "First token to last token.",
                        snap.request_decode_time_seconds)  # fmt: skip
        yield histogram("iteration_tokens_total", "Query tokens per engine step.",
                        snap.iteration_tokens_total)  # fmt: skip
        if snap.spec_decode_acceptance_length is not None:  # engines that speculate
            yield counter("spec_decode_num_drafts", "Rows that carried drafts into a step.",
                          snap.spec_decode_num_drafts)  # fmt: skip
            yield counter("spec_decode_num_draft_tokens", "Draft tokens proposed and verified.",
                          snap.spec_decode_num_draft_tokens)  # fmt: skip
            yield counter("spec_decode_num_accepted_tokens", "Draft tokens the runner accepted.",
                          snap.spec_decode_num_accepted_tokens)  # fmt: skip
            yield histogram("spec_decode_acceptance_length", "Accepted drafts per verified row.",
                            snap.spec_decode_acceptance_length)  # fmt: skip
        if snap.observations:
            obs = SummaryMetricFamily(
                PREFIX + "runner_observation", "Values the runner reported.",
                labels=[*names, "name"],
            )  # fmt: skip
            for name, count, total, _last in snap.observations:
                obs.add_metric([*values, name], count, total)
            yield obs


def _le(bound: float) -> str:
    if bound == float("inf"):
        return "+Inf"
    return repr(float(bound))
