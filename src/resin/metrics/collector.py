"""Counters and histograms the engine records, and the snapshot other threads read.

The engine thread is the only writer. It calls the `on_*` methods (cheap: a few integer adds
and one vectorized `searchsorted` per step); readers on other threads call `snapshot()`, which
copies everything under the same lock, so a snapshot is always self-consistent.
With `enable_metrics=False` the engine holds no collector at all: zero cost.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

F64 = npt.NDArray[np.float64]

TTFT_BUCKETS = (
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75,
    1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0,
)  # fmt: skip
ITL_BUCKETS = (
    0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75,
    1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0,
)  # fmt: skip
E2E_BUCKETS = (
    0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0,
    120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0,
)  # fmt: skip
REQUEST_TIME_BUCKETS = E2E_BUCKETS
ITERATION_TOKEN_BUCKETS = (1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)
ACCEPTANCE_BUCKETS = tuple(float(k) for k in range(17))
"""Accepted drafts per verified row: 0, 1, ..., 16 (a row verifies at most 16 today)."""


@dataclass(frozen=True, slots=True)
class HistogramSnapshot:
    """Cumulative-free bucket counts: `counts[i]` observations <= `buckets[i]` and above the
    previous bound; `counts[-1]` is the +Inf overflow."""

    buckets: tuple[float, ...]
    counts: tuple[int, ...]
    total: float
    count: int


class Histogram:
    def __init__(self, buckets: tuple[float, ...]) -> None:
        self.buckets = buckets
        self._bounds = np.asarray(buckets, dtype=np.float64)
        self.counts = np.zeros(len(buckets) + 1, dtype=np.int64)
        self.total = 0.0
        self.count = 0

    def observe(self, value: float) -> None:
        self.counts[int(np.searchsorted(self._bounds, value, side="left"))] += 1
        self.total += value
        self.count += 1

    def observe_many(self, values: F64) -> None:
        if values.size == 0:
            return
        idx = np.searchsorted(self._bounds, values, side="left")
        self.counts += np.bincount(idx, minlength=self.counts.size)
        self.total += float(values.sum())
        self.count += int(values.size)

    def snapshot(self) -> HistogramSnapshot:
        return HistogramSnapshot(self.buckets, tuple(self.counts.tolist()), self.total, self.count)


@dataclass(frozen=True, slots=True)
class MetricsSnapshot:
    """A consistent copy of every engine metric (names as in docs/metrics.md, without prefix)."""

    num_requests_running: int
    num_requests_waiting: int
    kv_cache_usage_perc: float
    prefix_cache_queries: int
    prefix_cache_hits: int
    num_preemptions: int
    prompt_tokens: int
    generation_tokens: int
    request_success: tuple[tuple[str, int], ...]
    time_to_first_token_seconds: HistogramSnapshot
    inter_token_latency_seconds: HistogramSnapshot
    e2e_request_latency_seconds: HistogramSnapshot
    request_queue_time_seconds: HistogramSnapshot
    request_prefill_time_seconds: HistogramSnapshot
    request_decode_time_seconds: HistogramSnapshot
    iteration_tokens_total: HistogramSnapshot
    num_steps: int
    observations: tuple[tuple[str, int, float, float], ...]
    """Runner observations: (name, count, sum, last value)."""
    prefix_cache_usage_perc: float = 0.0
    """Pages held only by the prefix cache (evictable), 0-1; not in kv_cache_usage_perc."""
    spec_decode_num_drafts: int = 0
    """Rows that carried drafts into a verify step."""
    spec_decode_num_draft_tokens: int = 0
    spec_decode_num_accepted_tokens: int = 0
    spec_decode_acceptance_length: HistogramSnapshot | None = None
    """Accepted drafts per verified row (None when the engine does not speculate)."""


class MetricsCollector:
    """Mutable metric state; the engine thread writes, `snapshot()` reads under the lock."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.running = 0
        self.waiting = 0
        self.cache_usage = 0.0
        self.prefix_cache_usage = 0.0
        self.prefix_queries = 0
        self.prefix_hits = 0
        self.preemptions = 0
        self.prompt_tokens = 0
        self.generation_tokens = 0
        self.num_steps = 0
        self.success: dict[str, int] = {"stop": 0, "length": 0, "abort": 0, "error": 0}
        self.ttft = Histogram(TTFT_BUCKETS)
        self.itl = Histogram(ITL_BUCKETS)
        self.e2e = Histogram(E2E_BUCKETS)
        self.queue_time = Histogram(REQUEST_TIME_BUCKETS)
        self.prefill_time = Histogram(REQUEST_TIME_BUCKETS)
        self.decode_time = Histogram(REQUEST_TIME_BUCKETS)
        self.iteration_tokens = Histogram(tuple(float(b) for b in ITERATION_TOKEN_BUCKETS))
        self.observations: dict[str, list[float]] = {}
        self.speculative = False
        """Set by an engine that proposes drafts: the spec_decode metrics are exported."""
        self.spec_drafts = 0
        self.spec_draft_tokens = 0
        self.spec_accepted_tokens = 0
        self.acceptance = Histogram(ACCEPTANCE_BUCKETS)

    def observe_runner(self, pairs: tuple[tuple[str, float], ...]) -> None:
        for name, value in pairs:
            entry = self.observations.setdefault(str(name), [0.0, 0.0, 0.0])
            entry[0] += 1
            entry[1] += float(value)
            entry[2] = float(value)

    def snapshot(self) -> MetricsSnapshot:
        with self.lock:
            return MetricsSnapshot(
                num_requests_running=self.running,
                num_requests_waiting=self.waiting,
                kv_cache_usage_perc=self.cache_usage,
                prefix_cache_usage_perc=self.prefix_cache_usage,
                prefix_cache_queries=self.prefix_queries,
                prefix_cache_hits=self.prefix_hits,
                num_preemptions=self.preemptions,
                prompt_tokens=self.prompt_tokens,
                generation_tokens=self.generation_tokens,
                request_success=tuple(sorted(self.success.items())),
                time_to_first_token_seconds=self.ttft.snapshot(),
                inter_token_latency_seconds=self.itl.snapshot(),
                e2e_request_latency_seconds=self.e2e.snapshot(),
                request_queue_time_seconds=self.queue_time.snapshot(),
                request_prefill_time_seconds=self.prefill_time.snapshot(),
                request_decode_time_seconds=self.decode_time.snapshot(),
                iteration_tokens_total=self.iteration_tokens.snapshot(),
                num_steps=self.num_steps,
                observations=tuple(
                    (k, int(v[0]), v[1], v[2]) for k, v in sorted(self.observations.items())
                ),
                spec_decode_num_drafts=self.spec_drafts,
                spec_decode_num_draft_tokens=self.spec_draft_tokens,
                spec_decode_num_accepted_tokens=self.spec_accepted_tokens,
                spec_decode_acceptance_length=(
                    self.acceptance.snapshot() if self.speculative else None
                ),
            )
