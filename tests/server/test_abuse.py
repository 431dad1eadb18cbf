"""Regression tests for abuse: leaked intake slots, multi-generation requests
under load, invalid Unicode, 500s on a kept-alive connection, tokenizing off the event loop,
and truncated answers that must never look complete."""

from __future__ import annotations

import asyncio
import json
import logging
import threading
import time
from collections.abc import Sequence
from typing import Any

import httpx
import pytest

from resin.frontend.errors import ClientTooSlow
from resin.recipe import RenderedPrompt, ToolDef
from resin.server.asgi import SSEResponse
from resin.server.launch import running
from tests.server.conftest import MODEL, make_server
from tests.server.doubles import ByteTokenizer, ChatMLFormat, FakeEngine

CHAT = "/v1/chat/completions"


def chat(text: str = "hi", **extra: Any) -> dict[str, Any]:
    return {"model": MODEL, "messages": [{"role": "user", "content": text}], **extra}


def queued(url: str) -> int:
    return int(httpx.get(url + "/health").json()["queued"])


def wait_queued_zero(url: str) -> int:
    deadline = time.monotonic() + 5
    while queued(url) and time.monotonic() < deadline:
        time.sleep(0.02)
    return queued(url)


def endless(prompt: object) -> list[int]:
    return [ord("a")]


# ---- item 1: reservations are released on every error path -----------------------------
def test_seed_overflow_with_n_is_400_and_releases_every_slot(serve: Any) -> None:
    with serve(request_queue_capacity=8) as url:
        for _ in range(20):  # 20 x 2 slots would fill the queue of 8 if any leaked
            r = httpx.post(url + CHAT, json=chat(n=2, seed=2**63 - 1, max_tokens=2))
            assert r.status_code == 400, r.text
            assert "seed" in r.json()["error"]["message"]
        assert queued(url) == 0
        assert httpx.post(url + CHAT, json=chat(max_tokens=2)).status_code == 200


def test_completion_batch_with_a_too_long_second_prompt_leaks_nothing(serve: Any) -> None:
    with serve(FakeEngine(context_length=64), request_queue_capacity=4) as url:
        for _ in range(10):
            r = httpx.post(
                url + "/v1/completions",
                json={"model": MODEL, "prompt": ["short", "x" * 200], "max_tokens": 2},
            )
            assert r.status_code == 400, r.text
        assert wait_queued_zero(url) == 0
        ok = httpx.post(url + "/v1/completions", json={"prompt": "short", "max_tokens": 2})
        assert ok.status_code == 200


# ---- item 2: n > 1 under load reads every generation concurrently -------------------------
def test_many_generations_under_load_all_finish() -> None:
    engine = FakeEngine(endless, step_delay=0.003)
    server = make_server(engine, client_buffer=2, admissions_per_step=1)
    with running(server) as url:
        r = httpx.post(url + CHAT, json=chat(n=16, max_tokens=40), timeout=60)
        assert r.status_code == 200, r.text
        reasons = [c["finish_reason"] for c in r.json()["choices"]]
        assert reasons == ["length"] * 16
        with httpx.stream("POST", url + CHAT, json=chat(n=16, max_tokens=40, stream=True)) as s:
            lines = [ln for ln in s.iter_lines() if ln.startswith("data: ")]
        assert lines[-1] == "data: [DONE]"
        chunks = [json.loads(ln[6:]) for ln in lines[:-1]]
        finished = [c["choices"][0] for c in chunks if c["choices"][0]["finish_reason"]]
        assert sorted(c["index"] for c in finished) == list(range(16))
        assert wait_queued_zero(url) == 0


# ---- item 3: a lone surrogate is the client's 400 on every route ------------------------
def test_lone_surrogate_prompt_is_400(url: str) -> None:
    raw = '{"prompt": "\\ud800x", "max_tokens": 2}'  # JSON escapes a lone surrogate
    r = httpx.post(
        url + "/v1/completions", content=raw, headers={"content-type": "application/json"}
    )
    assert r.status_code == 400, r.text
    raw = '{"messages": [{"role": "user", "content": "\\ud800x"}], "max_tokens": 2}'
    r = httpx.post(url + CHAT, content=raw, headers={"content-type": "application/json"})
    assert r.status_code == 400, r.text


# ---- item 4: a 500 says Connection: close, and the next request still works ----------------
class BrokenParserFormat(ChatMLFormat):
    def create_parser(
        self, prompt: RenderedPrompt, *, tools: Sequence[ToolDef] | None = None
    ) -> Any:
        raise RuntimeError("parser bug")


def test_internal_error_closes_the_connection_cleanly() -> None:
    server = make_server()
    server.service.recipe = BrokenParserFormat(ByteTokenizer())
    with running(server) as url, httpx.Client(base_url=url) as client:
        r = client.post(CHAT, json=chat(max_tokens=2))
        assert r.status_code == 500
        assert r.headers.get("connection") == "close"
        assert client.get("/health").status_code == 200  # a fresh connection, no reset
        assert queued(url) == 0


# ---- item 5: tokenizing runs off the event loop, after a cheap length check ------------------
class SpyTokenizer(ByteTokenizer):
    def __init__(self) -> None:
        self.calls: list[tuple[int, str]] = []

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        self.calls.append((len(text), threading.current_thread().name))
        return super().encode(text, add_special_tokens)


def test_huge_prompt_is_refused_before_tokenizing_and_work_is_off_the_loop() -> None:
    from resin.server import HttpServer
    from resin.server.launch import free_port

    tok = SpyTokenizer()
    server = HttpServer(
        FakeEngine(), ChatMLFormat(tok), tokenizer=tok, model=MODEL, port=free_port()
    )
    with running(server) as url:
        huge = "a" * 3_900_000
        for path, payload in (
            ("/v1/completions", {"prompt": huge, "max_tokens": 2}),
            (CHAT, chat(huge, max_tokens=2)),
        ):
            r = httpx.post(url + path, json=payload, timeout=30)
            assert r.status_code == 400 and "cannot fit" in r.text, r.text
        assert all(n < 1_000_000 for n, _ in tok.calls)
        tok.calls.clear()
        assert httpx.post(url + CHAT, json=chat("hello", max_tokens=2)).status_code == 200
        r = httpx.post(url + "/v1/completions", json={"prompt": "hello", "max_tokens": 2})
        assert r.status_code == 200
        assert tok.calls and all(name != "resin-http" for _, name in tok.calls), tok.calls


# ---- item 6: truncated answers are never reported complete ----------------------------------
def _stream_then_shutdown(path: str, payload: dict[str, Any]) -> list[str]:
    server = make_server(FakeEngine(endless, step_delay=0.005))
    lines: list[str] = []
    with running(server) as url:

        def reader() -> None:
            with httpx.stream("POST", url + path, json=payload, timeout=30) as r:
                for line in r.iter_lines():
                    lines.append(line)

        t = threading.Thread(target=reader)
        t.start()
        deadline = time.monotonic() + 20
        while len(lines) < 40 and time.monotonic() < deadline:
            time.sleep(0.02)  # streaming for a while (a loaded machine starts slowly)
        server.shutdown()
        t.join(20)
        assert not t.is_alive()
    return lines


def test_shutdown_mid_stream_is_an_error_not_a_stop() -> None:
    lines = _stream_then_shutdown(CHAT, chat("s", max_tokens=100000, stream=True))
    data = [ln for ln in lines if ln.startswith("data: ")]
    assert len(data) > 10
    assert "data: [DONE]" not in data
    assert not any('"finish_reason":"stop"' in d for d in data)
    assert "shutting down" in json.loads(data[-1][6:])["error"]["message"]


def test_shutdown_mid_stream_anthropic_and_responses() -> None:
    msg = {"model": MODEL, "max_tokens": 100000, "stream": True}
    msg["messages"] = [{"role": "user", "content": "s"}]
    lines = _stream_then_shutdown("/v1/messages", msg)
    assert "event: error" in lines and "event: message_stop" not in lines
    lines = _stream_then_shutdown("/v1/responses", {"input": "s", "stream": True})
    assert "event: response.failed" in lines and "event: response.completed" not in lines


def test_slow_reader_cut_ends_with_an_error_event() -> None:
    async def events() -> Any:
        yield "data: {}\n\n"
        raise ClientTooSlow("behind")

    sent: list[dict[str, Any]] = []

    async def run() -> None:
        async def receive() -> dict[str, Any]:
            await asyncio.sleep(10)
            return {"type": "http.disconnect"}

        async def send(message: dict[str, Any]) -> None:
            sent.append(message)

        await SSEResponse(events())({"type": "http"}, receive, send)

    asyncio.run(run())
    body = b"".join(m.get("body", b"") for m in sent).decode()
    assert '"error"' in body and "cut off" in body
    assert sent[-1] == {"type": "http.response.body", "body": b"", "more_body": False}


# ---- a recipe crash is a 500 with a logged traceback, never a client 400 -----------
class CrashingRecipe(ChatMLFormat):
    def render(self, messages: Any, **kwargs: Any) -> RenderedPrompt:
        raise KeyError("role_map")  # a bug in the recipe, not a bad request


def test_recipe_crash_is_a_500_with_a_logged_traceback(caplog: pytest.LogCaptureFixture) -> None:
    server = make_server()
    server.service.recipe = CrashingRecipe(ByteTokenizer())
    with caplog.at_level(logging.ERROR, logger="resin.server"), running(server) as url:
        r = httpx.post(url + CHAT, json=chat(max_tokens=2))
        assert r.status_code == 500, r.text
        assert r.json()["error"]["message"] == "internal error: KeyError"
        assert queued(url) == 0
    crash = [rec for rec in caplog.records if "crashed rendering" in rec.getMessage()]
    assert crash and crash[0].exc_info is not None and crash[0].exc_info[0] is KeyError


def test_template_raise_exception_stays_a_400() -> None:
    class Refusing(ChatMLFormat):
        def render(self, messages: Any, **kwargs: Any) -> RenderedPrompt:
            raise ValueError("chat template error: roles must alternate")

    server = make_server()
    server.service.recipe = Refusing(ByteTokenizer())
    with running(server) as url:
        r = httpx.post(url + CHAT, json=chat(max_tokens=2))
        assert r.status_code == 400 and "roles must alternate" in r.text
