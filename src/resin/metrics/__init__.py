"""Engine-native metrics: counters and histograms the engine updates per step, a thread-safe
snapshot for readers, and a Prometheus exporter that imports `prometheus_client` lazily."""

from resin.metrics.collector import (
    E2E_BUCKETS,
    ITERATION_TOKEN_BUCKETS,
    ITL_BUCKETS,
    REQUEST_TIME_BUCKETS,
    TTFT_BUCKETS,
    HistogramSnapshot,
    MetricsCollector,
    MetricsSnapshot,
)
from resin.metrics.prometheus import PrometheusExporter

__all__ = [
    "E2E_BUCKETS",
    "ITERATION_TOKEN_BUCKETS",
    "ITL_BUCKETS",
    "REQUEST_TIME_BUCKETS",
    "TTFT_BUCKETS",
    "HistogramSnapshot",
    "MetricsCollector",
    "MetricsSnapshot",
    "PrometheusExporter",
]
