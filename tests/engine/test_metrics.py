"""Engine metrics: counters match the workload; the Prometheus exposition has vLLM-style
names and buckets; snapshots are safe to read from another thread."""

from __future__ import annotations

import threading

import numpy as np
from prometheus_client.parser import text_string_to_metric_families

from resin import BatchPlan, Engine, ForwardOutput, SamplingParams
from resin.metrics import ITL_BUCKETS, TTFT_BUCKETS, MetricsSnapshot, PrometheusExporter
from tests.engine.fakes import CacheSimRunner


class Observing(CacheSimRunner):
    def forward(self, plan: BatchPlan) -> ForwardOutput:
        out = super().forward(plan)
        return ForwardOutput(out.token_ids, out.token_indptr, observations=(("kernel_ms", 1.5),))


def _run(engine: Engine, n: int) -> list[object]:
    requests = [
        engine.submit([1 + i, 2, 3, 4, 5], SamplingParams(max_output_tokens=3 + i % 3))
        for i in range(n)
    ]
    while engine.has_work():
        engine.step()
    return requests


def test_counters_match_the_workload() -> None:
    engine = Engine(Observing(page_size=4, num_pages=64, vocab=50), context_length=64)
    requests = _run(engine, 6)
    snap = engine.metrics
    assert isinstance(snap, MetricsSnapshot)
    outputs = sum(len(r.output_token_ids) for r in requests)  # type: ignore[attr-defined]
    assert snap.generation_tokens == outputs
    assert snap.prompt_tokens == 6 * 5
    assert sum(c for _, c in snap.request_success) == 6
    assert snap.time_to_first_token_seconds.count == 6
    assert snap.inter_token_latency_seconds.count == outputs - 6
    assert snap.e2e_request_latency_seconds.count == 6
    assert snap.iteration_tokens_total.count == snap.num_steps
    assert snap.num_requests_running == 0 and snap.num_requests_waiting == 0
    assert snap.observations[0][:2] == ("kernel_ms", snap.num_steps)


def test_replicas_render_one_family_per_name_with_a_replica_label() -> None:
    """A data-parallel server exports its replicas' engines as labelled series of one family."""
    engines = [
        Engine(Observing(page_size=4, num_pages=64, vocab=50), context_length=64) for _ in range(2)
    ]
    _run(engines[0], 2)
    _run(engines[1], 3)
    text = PrometheusExporter(engines, model_name="m").render().decode()
    families = {f.name: f for f in text_string_to_metric_families(text)}
    assert text.count("# TYPE resin:generation_tokens_total counter") == 1
    for name in ("resin:prompt_tokens", "resin:num_requests_running", "resin:runner_observation"):
        labels = [s.labels for s in families[name].samples if not s.name.endswith("_created")]
        assert {(x["model_name"], x["replica"]) for x in labels} == {("m", "0"), ("m", "1")}
    prompts = {s.labels["replica"]: s.value for s in families["resin:prompt_tokens"].samples}
    assert prompts == {"0": 10.0, "1": 15.0}
    success = families["resin:request_success"].samples
    assert sum(s.value for s in success if s.labels["replica"] == "1") == 3
    ttft = families["resin:time_to_first_token_seconds"].samples
    assert {s.labels["replica"] for s in ttft} == {"0", "1"}


def test_metrics_off_costs_nothing_and_reads_none() -> None:
    engine = Engine(CacheSimRunner(), enable_metrics=False)
    _run(engine, 2)
    assert engine.metrics is None and engine._collector is None


def test_prometheus_names_and_buckets() -> None:
    engine = Engine(Observing(page_size=4, num_pages=64, vocab=50), prefix_cache=True)
    _run(engine, 3)
    text = PrometheusExporter(engine, model_name="m").render().decode()
    families = {f.name: f for f in text_string_to_metric_families(text)}
    for name in [
        "num_requests_running", "num_requests_waiting", "kv_cache_usage_perc",
        "prefix_cache_queries", "prefix_cache_hits", "num_preemptions", "prompt_tokens",
        "generation_tokens", "request_success", "time_to_first_token_seconds",
        "inter_token_latency_seconds", "e2e_request_latency_seconds",
        "request_queue_time_seconds", "request_prefill_time_seconds",
        "request_decode_time_seconds", "iteration_tokens_total",
    ]:  # fmt: skip
        assert "resin:" + name in families, name
    assert "resin:generation_tokens_total" in text
    ttft = families["resin:time_to_first_token_seconds"]
    bounds = [float(s.labels["le"]) for s in ttft.samples if s.name.endswith("_bucket")]
    assert bounds == [*TTFT_BUCKETS, float("inf")]
    itl = families["resin:inter_token_latency_seconds"]
    bounds = [float(s.labels["le"]) for s in itl.samples if s.name.endswith("_bucket")]
    assert bounds == [*ITL_BUCKETS, float("inf")]
    assert all(s.labels.get("model_name") == "m" for s in ttft.samples)
    success = {
        s.labels["finished_reason"]: s.value for s in families["resin:request_success"].samples
    }
    assert success["length"] + success["stop"] == 3


def test_snapshots_are_consistent_from_another_thread() -> None:
    engine = Engine(CacheSimRunner(page_size=4, num_pages=256, vocab=50), context_length=64)
    stop = threading.Event()
    seen: list[int] = []

    def reader() -> None:
        while not stop.is_set():
            snap = engine.metrics
            assert snap is not None
            h = snap.inter_token_latency_seconds
            assert sum(h.counts) == h.count  # never torn
            seen.append(snap.generation_tokens)

    thread = threading.Thread(target=reader)
    thread.start()
    try:
        _run(engine, 20)
    finally:
        stop.set()
        thread.join()
    assert seen == sorted(seen) and np.size(seen) > 0


def test_import_resin_does_not_import_prometheus_client() -> None:
    import os
    import subprocess
    import sys
    from pathlib import Path

    import resin

    src = str(Path(resin.__file__).resolve().parents[1])  # this checkout's src/, not a wheel
    env = {**os.environ, "PYTHONPATH": src}
    code = "import sys, resin, resin.metrics; print('prometheus_client' in sys.modules)"
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env
    )
    assert out.stdout.strip() == "False"


def test_gauges_follow_aborts_even_when_no_step_runs() -> None:
    # Found by the server tests: after aborting everything, `step()` had no work and returned
    # before refreshing the gauges, so /metrics kept reporting the aborted requests as running.
    engine = Engine(CacheSimRunner(), context_length=64)
    requests = [engine.submit([1, 2, 3], SamplingParams(max_output_tokens=50)) for _ in range(3)]
    engine.step()
    snap = engine.metrics
    assert snap is not None and snap.num_requests_running == 3
    for request in requests:
        engine.abort(request)
    engine.step()
    snap = engine.metrics
    assert snap is not None and snap.num_requests_running == 0 and snap.num_requests_waiting == 0
