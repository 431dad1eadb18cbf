"""/metrics tells the truth. `num_requests_waiting` includes the server's
intake queue; `kv_cache_usage_perc` leaves out evictable prefix-cache pages (their own gauge),
so an idle server with a warm prefix cache reads 0."""

from __future__ import annotations

import threading
import time

import httpx
from prometheus_client.parser import text_string_to_metric_families

from resin.engine import Engine
from resin.server.launch import running
from resin_app.loading import ZeroCostRunner
from tests.server.conftest import make_server
from tests.server.doubles import ByteTokenizer

CHAT = "/v1/chat/completions"


def gauges(url: str) -> dict[str, float]:
    text = httpx.get(url + "/metrics").text
    return {
        s.name: s.value
        for f in text_string_to_metric_families(text)
        for s in f.samples
        if f.type == "gauge"
    }


def test_idle_cache_usage_excludes_prefix_pages() -> None:
    engine = Engine(
        ZeroCostRunner(ByteTokenizer.vocab_size, ord("a")), context_length=4096, prefix_cache=True
    )
    with running(make_server(engine)) as url:
        prompt = "a long shared system prompt " * 20
        for i in range(4):
            body = {"messages": [{"role": "user", "content": prompt + str(i)}], "max_tokens": 8}
            assert httpx.post(url + CHAT, json=body).status_code == 200
        time.sleep(0.2)
        g = gauges(url)
        assert g["resin:num_requests_running"] == 0
        assert g["resin:kv_cache_usage_perc"] == 0.0
        assert g["resin:prefix_cache_usage_perc"] > 0.0


def test_waiting_counts_the_intake_queue() -> None:
    engine = Engine(ZeroCostRunner(ByteTokenizer.vocab_size, ord("a")), context_length=100_000)
    server = make_server(engine, max_active=1)
    with running(server) as url:
        stop = threading.Event()

        def stream() -> None:
            body = {
                "messages": [{"role": "user", "content": "x"}],
                "max_tokens": 90_000,
                "ignore_eos": True,
                "stream": True,
            }
            with httpx.stream("POST", url + CHAT, json=body, timeout=60) as r:
                for _ in r.iter_lines():
                    if stop.is_set():
                        return

        threads = [threading.Thread(target=stream) for _ in range(6)]
        for t in threads:
            t.start()
        try:
            deadline = time.monotonic() + 10
            seen = 0.0
            while time.monotonic() < deadline and seen < 5:
                seen = gauges(url)["resin:num_requests_waiting"]
                time.sleep(0.05)
            # one request in the engine (max_active=1), five held in the server's intake
            assert seen == 5, seen
            assert engine.num_waiting == 0
        finally:
            stop.set()
            for t in threads:
                t.join(30)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and gauges(url)["resin:num_requests_waiting"]:
            time.sleep(0.05)
        assert gauges(url)["resin:num_requests_waiting"] == 0
