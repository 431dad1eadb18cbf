"""Bounds and lifecycle: burst vs a small queue, disconnects, slow readers, engine death,
shutdown. The fake engine sleeps a little per step so requests overlap like real ones."""

from __future__ import annotations

import asyncio
import threading
import time

import aiohttp
import httpx
import pytest

from resin.frontend.errors import ClientTooSlow
from resin.frontend.stream import RequestStream
from resin.server.launch import running
from tests.server.conftest import MODEL, assert_stops_listening, make_server
from tests.server.doubles import ByteTokenizer, FakeEngine

CHAT = "/v1/chat/completions"


def body(text: str, max_tokens: int, stream: bool = False) -> dict[str, object]:
    return {
        "model": MODEL,
        "messages": [{"role": "user", "content": text}],
        "max_tokens": max_tokens,
        "stream": stream,
    }


def test_burst_gets_only_200_and_429_and_health_stays_up() -> None:
    engine = FakeEngine(step_delay=0.002)
    server = make_server(engine, request_queue_capacity=64)
    health: list[bool] = []

    async def burst(url: str) -> list[int]:
        # aiohttp: httpx's pool is too slow on 2 cores to make 2,000 requests a burst.
        stop = asyncio.Event()

        async def poll_health() -> None:
            async with aiohttp.ClientSession() as probe:
                while not stop.is_set():
                    t0 = time.perf_counter()
                    async with probe.get(url + "/health") as r:
                        health.append(r.status == 200 and time.perf_counter() - t0 < 5)
                    await asyncio.sleep(0.05)

        async def one(session: aiohttp.ClientSession, i: int) -> int:
            async with session.post(url + CHAT, json=body(f"req {i}", 8)) as r:
                await r.read()
                if r.status == 429:
                    assert int(r.headers["retry-after"]) >= 1
                return r.status

        poller = asyncio.ensure_future(poll_health())
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=500)) as session:
            codes = await asyncio.gather(*(one(session, i) for i in range(2000)))
        stop.set()
        await poller
        return list(codes)

    with running(server) as url:
        codes = asyncio.run(burst(url))
    assert set(codes) <= {200, 429}, set(codes)
    assert codes.count(200) >= 64 and codes.count(429) > 0
    assert health and all(health)


def endless(prompt: object) -> list[int]:
    return [ord("a")]  # never a stop token: only max_tokens, an abort or shutdown ends it


def real_engine(context_length: int = 4096) -> object:
    """The real Engine with a zero-cost runner."""
    from resin.engine import Engine
    from resin_app.loading import ZeroCostRunner

    return Engine(
        ZeroCostRunner(ByteTokenizer.vocab_size, ord("a")),
        context_length=context_length,
        max_sequences=256,
    )


@pytest.mark.parametrize("kind", ["fake", "real"])
def test_disconnecting_clients_leave_no_pages_held(kind: str) -> None:
    engine = FakeEngine(endless, step_delay=0.002) if kind == "fake" else real_engine()
    server = make_server(engine)  # type: ignore[arg-type]

    async def clients(url: str) -> None:
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=250)) as session:

            async def one(i: int) -> None:
                async with session.post(url + CHAT, json=body(f"c{i}", 2000, True)) as r:
                    assert r.status == 200
                    await r.content.readline()  # the first event, then hang up
                    r.close()

            await asyncio.gather(*(one(i) for i in range(200)))

    with running(server) as url:
        asyncio.run(clients(url))
        deadline = time.monotonic() + 20
        while (engine.num_running or engine.num_waiting) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert engine.num_running == 0 and engine.num_waiting == 0
        if isinstance(engine, FakeEngine):
            assert engine.kv_cache_usage == 0.0
            assert engine.steps < 1500  # aborted long before their 2,000 tokens
        else:
            assert engine._scheduler.cache.pool.num_used == 0  # type: ignore[attr-defined]
            engine.check_invariants()  # type: ignore[attr-defined]
        if isinstance(engine, FakeEngine):
            gauges = httpx.get(url + "/metrics").text
            assert "resin:num_requests_running 0.0" in gauges


async def _overflow() -> None:
    stream = RequestStream(capacity=2)
    assert stream.push([]) and stream.push([])
    assert not stream.push([])  # the third batch finds the buffer full: cut off
    await stream.get()  # what was buffered is still readable
    with pytest.raises(ClientTooSlow):
        await stream.get()


def test_slow_reader_is_cut_off() -> None:
    asyncio.run(_overflow())


def test_engine_failure_answers_503_and_stops_listener() -> None:
    engine = FakeEngine(step_delay=0.01, fail_at_step=5)
    server = make_server(engine)
    with running(server) as url:
        r = httpx.post(url + CHAT, json=body("x", 500), timeout=30)
        assert r.status_code == 503 and "engine" in r.json()["error"]["message"]
        after = httpx.post(url + CHAT, json=body("y", 5), timeout=30)
        assert after.status_code == 503
        assert httpx.get(url + "/health").status_code == 503
        assert_stops_listening(url)


def test_shutdown_ends_open_streams_with_an_error() -> None:
    engine = FakeEngine(endless, step_delay=0.005)
    server = make_server(engine)
    lines: list[str] = []
    with running(server) as url:

        def reader() -> None:
            with httpx.stream("POST", url + CHAT, json=body("s", 100000, True), timeout=30) as r:
                for line in r.iter_lines():
                    lines.append(line)

        t = threading.Thread(target=reader)
        t.start()
        deadline = time.monotonic() + 20
        while len(lines) < 40 and time.monotonic() < deadline:
            time.sleep(0.02)
        server.shutdown()
        t.join(20)
        assert not t.is_alive()
    data = [ln for ln in lines if ln.startswith("data: ")]
    assert "shutting down" in data[-1]  # an error event: the answer was cut, not complete
    assert len(data) > 10  # tokens streamed before the shutdown
    assert engine.num_running == 0


def test_client_that_stops_reading_is_cancelled_without_blocking_others() -> None:
    import json
    import socket

    engine = FakeEngine(endless, context_length=400_000)
    server = make_server(engine, client_buffer=4)
    with running(server) as url:
        host, port = url.removeprefix("http://").split(":")
        payload = json.dumps(body("never read", 390_000, True)).encode()
        stuck = socket.create_connection((host, int(port)))
        stuck.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        stuck.sendall(
            b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
            + b"Content-Type: application/json\r\n"
            + f"Content-Length: {len(payload)}\r\n\r\n".encode()
            + payload
        )
        try:
            # Others are served while the stuck client's socket is full.
            ok = httpx.post(url + CHAT, json=body("fine", 8), timeout=30)
            assert ok.status_code == 200
            deadline = time.monotonic() + 30
            while engine.num_running and time.monotonic() < deadline:
                time.sleep(0.05)
            assert engine.num_running == 0
            assert engine.steps < 20_000  # cut off after ~4 * 64 buffered events, not 390k
            assert httpx.get(url + "/health", timeout=5).status_code == 200
        finally:
            stuck.close()
