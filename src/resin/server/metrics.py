"""Prometheus metrics measured at the HTTP layer (vLLM's names, `resin:` prefix).

One `ServerMetrics` per app, on its own registry (no module globals). Histograms are observed when a
generation finishes.
"""

from __future__ import annotations

from collections.abc import Callable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from resin.frontend.generation import Finish

TTFT_BUCKETS = (
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1, 2.5, 5, 7.5, 10,
    20, 40, 80, 160, 640, 2560,
)  # fmt: skip
ITL_BUCKETS = (
    0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1, 2.5, 5, 7.5, 10, 20,
    40, 80,
)  # fmt: skip
E2E_BUCKETS = (0.3, 0.5, 0.8, 1, 1.5, 2, 2.5, 5, 10, 15, 20, 30, 40, 50, 60, 120, 240, 480)


class ServerMetrics:
    """`rejected` (intake refusals) always. With `engine_render` (the engine's own exporter:
    the real engine keeps metrics) the engine-side names come from the engine and nothing else
    is recorded here; without it (an engine without metrics, the tests' fake engine) the
    request names of docs/metrics.md are measured at the HTTP layer (`requests`)."""

    def __init__(
        self,
        running: Callable[[], float],
        waiting: Callable[[], float],
        engine_render: Callable[[], bytes] | None = None,
    ) -> None:
        self.engine_render = engine_render
        self.registry = CollectorRegistry()
        self.rejected = Counter(
            "resin:http_requests_rejected",
            "Requests refused at intake",
            ["status"],
            registry=self.registry,
        )
        self.requests = None if engine_render else RequestMetrics(self.registry, running, waiting)

    def observe(self, finish: Finish, ttft: float | None, e2e: float) -> None:
        """A generation finished (`ttft`: seconds to its first token; `e2e`: to its end)."""
        if self.requests is not None:
            self.requests.observe(finish, ttft, e2e)

    def render(self) -> bytes:
        own = generate_latest(self.registry)
        return own if self.engine_render is None else self.engine_render() + own


class RequestMetrics:
    """The request metrics of docs/metrics.md, measured at the HTTP layer."""

    def __init__(
        self, r: CollectorRegistry, running: Callable[[], float], waiting: Callable[[], float]
    ) -> None:
        Gauge("resin:num_requests_running", "Requests in the engine", registry=r).set_function(
            running
        )
        Gauge("resin:num_requests_waiting", "Requests queued", registry=r).set_function(waiting)
        self.prompt_tokens = Counter("resin:prompt_tokens", "Prompt tokens", registry=r)
        self.generation_tokens = Counter("resin:generation_tokens", "Generated tokens", registry=r)
        self.prefix_cache_hits = Counter(
            "resin:prefix_cache_hits", "Prompt tokens served from cache", registry=r
        )
        self.prefix_cache_queries = Counter(
            "resin:prefix_cache_queries", "Prompt tokens looked up in the cache", registry=r
        )
        self.request_success = Counter(
            "resin:request_success", "Finished requests", ["finished_reason"], registry=r
        )
        self.ttft = Histogram(
            "resin:time_to_first_token_seconds", "TTFT", buckets=TTFT_BUCKETS, registry=r
        )
        self.itl = Histogram(
            "resin:inter_token_latency_seconds", "ITL", buckets=ITL_BUCKETS, registry=r
        )
        self.e2e = Histogram(
            "resin:e2e_request_latency_seconds", "E2E latency", buckets=E2E_BUCKETS, registry=r
        )

    def observe(self, finish: Finish, ttft: float | None, e2e: float) -> None:
        output = finish.completion_tokens
        self.prompt_tokens.inc(finish.prompt_tokens)
        self.generation_tokens.inc(output)
        self.prefix_cache_queries.inc(finish.prompt_tokens)
        self.prefix_cache_hits.inc(finish.cached_tokens)
        self.request_success.labels(finish.reason).inc()
        if ttft is not None:
            self.ttft.observe(ttft)
            if output > 1:
                self.itl.observe((e2e - ttft) / (output - 1))
        self.e2e.observe(e2e)
