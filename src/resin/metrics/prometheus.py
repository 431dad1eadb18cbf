"""Prometheus text exposition of an engine's metrics (`prometheus_client`, imported lazily).

```python
exporter = PrometheusExporter(engine, model_name="smollm2")
body: bytes = exporter.render()        # serve with exporter.content_type at /metrics
PrometheusExporter([engine0, engine1])  # data-parallel replicas: one series each, replica="i"
```

Names carry the `resin:` prefix and mirror vLLM's (docs/metrics.md); counters get the
`_total` suffix from the exposition format; histogram buckets are those in `collector.py`.
The exporter reads one `MetricsSnapshot` per render, so it never blocks the engine for long.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from operator import attrgetter
from typing import Any, Protocol, TypeAlias

from resin.metrics.collector import HistogramSnapshot, MetricsSnapshot


class MetricsSource(Protocol):
    """What the exporter reads: an `Engine` (or anything with its `metrics` property)."""

    @property
    def metrics(self) -> MetricsSnapshot | None: ...


PREFIX = "resin:"
Source: TypeAlias = MetricsSource | Callable[[], MetricsSnapshot | None]
_Labelled = list[tuple[list[str], MetricsSnapshot]]

_GAUGES = (
    ("num_requests_running", "Requests admitted (prefill or decode)."),
    ("num_requests_waiting", "Requests queued."),
    ("kv_cache_usage_perc", "Fraction of cache pages held by live requests (0-1; evictable "
     "prefix-cache pages excluded)."),
    ("prefix_cache_usage_perc",
     "Fraction of cache pages held only by the prefix cache (evictable, 0-1)."),
)  # fmt: skip
_COUNTERS = (
    ("prefix_cache_queries", "Prompt tokens looked up in the prefix cache."),
    ("prefix_cache_hits", "Prompt tokens served by the prefix cache."),
    ("num_preemptions", "Retractions (preempt + recompute)."),
    ("prompt_tokens", "Prompt tokens of requests that started generating."),
    ("generation_tokens", "Generated tokens."),
)
_HISTOGRAMS = (
    ("time_to_first_token_seconds", "Time to first token."),
    ("inter_token_latency_seconds", "Time between consecutive tokens."),
    ("e2e_request_latency_seconds", "Submit to finish."),
    ("request_queue_time_seconds", "Submit to first admission."),
    ("request_prefill_time_seconds", "First admission to first token."),
    ("request_decode_time_seconds", "First token to last token."),
    ("iteration_tokens_total", "Query tokens per engine step."),
)
_SPECULATION = (
    ("spec_decode_num_drafts", "Rows that carried drafts into a step."),
    ("spec_decode_num_draft_tokens", "Draft tokens proposed and verified."),
    ("spec_decode_num_accepted_tokens", "Draft tokens the runner accepted."),
)


class PrometheusExporter:
    """Renders an engine's metrics snapshot in the Prometheus text format.

    `source` is an engine (or a callable returning a snapshot), or a sequence of them: the
    replicas of a data-parallel server, each rendered as its own series labelled
    `replica="0"`, `replica="1"`, ... under one metric family per name.
    """

    content_type = "text/plain; version=0.0.4; charset=utf-8"

    def __init__(self, source: Source | Sequence[Source], model_name: str | None = None) -> None:
        many = isinstance(source, Sequence)
        sources = list(source) if isinstance(source, Sequence) else [source]
        self._names = ([] if model_name is None else ["model_name"]) + (["replica"] if many else [])
        self._sources = [
            (
                ([] if model_name is None else [model_name]) + ([str(i)] if many else []),
                _reader(src),
            )
            for i, src in enumerate(sources)
        ]

    def render(self) -> bytes:
        from prometheus_client import CollectorRegistry, generate_latest

        registry = CollectorRegistry(auto_describe=False)
        registry.register(_Collector(self._names, self._sources))
        return bytes(generate_latest(registry))


def _reader(source: Source) -> Callable[[], MetricsSnapshot | None]:
    if callable(source):
        return source
    return lambda: source.metrics


class _Collector:
    def __init__(
        self,
        names: list[str],
        sources: list[tuple[list[str], Callable[[], MetricsSnapshot | None]]],
    ) -> None:
        self._names = names
        self._sources = sources

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        snaps: _Labelled = [(v, s) for v, read in self._sources if (s := read()) is not None]
        if not snaps:
            return
        names = self._names
        for name, doc in _GAUGES:
            gauge = GaugeMetricFamily(PREFIX + name, doc, labels=names)
            for values, snap in snaps:
                gauge.add_metric(values, getattr(snap, name))
            yield gauge
        yield from _counters(names, snaps, _COUNTERS)
        success = CounterMetricFamily(
            PREFIX + "request_success", "Finished requests by reason.",
            labels=[*names, "finished_reason"],
        )  # fmt: skip
        for values, snap in snaps:
            for reason, count in snap.request_success:
                success.add_metric([*values, reason], count)
        yield success
        for name, doc in _HISTOGRAMS:
            yield _histogram(name, doc, names, [(v, getattr(s, name)) for v, s in snaps])
        speculating = [(v, s) for v, s in snaps if s.spec_decode_acceptance_length is not None]
        if speculating:  # engines that speculate
            yield from _counters(names, speculating, _SPECULATION)
            acceptance = attrgetter("spec_decode_acceptance_length")
            yield _histogram("spec_decode_acceptance_length", "Accepted drafts per verified row.",
                             names, [(v, acceptance(s)) for v, s in speculating])  # fmt: skip
        observed = [(v, s) for v, s in snaps if s.observations]
        if observed:
            yield _observations(names, observed)


def _counters(
    names: list[str], snaps: _Labelled, table: tuple[tuple[str, str], ...]
) -> Iterator[Any]:
    from prometheus_client.core import CounterMetricFamily

    for name, doc in table:
        counter = CounterMetricFamily(PREFIX + name, doc, labels=names)
        for values, snap in snaps:
            counter.add_metric(values, getattr(snap, name))
        yield counter


def _histogram(
    name: str, doc: str, names: list[str], series: list[tuple[list[str], HistogramSnapshot]]
) -> Any:
    from prometheus_client.core import HistogramMetricFamily

    family = HistogramMetricFamily(PREFIX + name, doc, labels=names)
    for values, h in series:
        cumulative, buckets = 0, []
        for bound, count in zip([*h.buckets, float("inf")], h.counts, strict=True):
            cumulative += count
            buckets.append((_le(bound), cumulative))
        family.add_metric(values, buckets, h.total)
    return family


def _observations(names: list[str], snaps: _Labelled) -> Any:
    from prometheus_client.core import SummaryMetricFamily

    obs = SummaryMetricFamily(
        PREFIX + "runner_observation", "Values the runner reported.", labels=[*names, "name"]
    )
    for values, snap in snaps:
        for name, count, total, _last in snap.observations:
            obs.add_metric([*values, name], count, total)
    return obs


def _le(bound: float) -> str:
    if bound == float("inf"):
        return "+Inf"
    return repr(float(bound))
