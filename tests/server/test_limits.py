"""Regression tests for connection limits (header timeout and size,
keep-alive, max connections), chunked bodies over the cap, 401 challenges, clear messages,
per-request generation caps and the Host allow-list."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from resin.server.connection_limits import ConnectionLimits
from resin.server.launch import running
from tests.server.conftest import MODEL, make_server

CHAT = "/v1/chat/completions"
FAST = ConnectionLimits(
    timeout_keep_alive=1, timeout_headers=0.5, max_header_bytes=8 * 1024, max_connections=8
)


@pytest.fixture(scope="module")
def limited() -> Iterator[str]:
    with running(make_server(connection_limits=FAST, request_queue_capacity=64)) as url:
        yield url


def connect(url: str) -> socket.socket:
    host, port = url.removeprefix("http://").split(":")
    s = socket.create_connection((host, int(port)), timeout=5)
    return s


def read_all(s: socket.socket, limit: float = 5.0) -> bytes:
    """Everything until the server closes (or `limit` seconds pass)."""
    s.settimeout(limit)
    out = b""
    deadline = time.monotonic() + limit
    try:
        while time.monotonic() < deadline:
            chunk = s.recv(65536)
            if not chunk:
                break
            out += chunk
    except (TimeoutError, ConnectionResetError):
        pass
    return out


# ---- item 8: connection timeouts and header limits --------------------------------------
def test_silent_and_slowloris_connections_are_closed(limited: str) -> None:
    silent = connect(limited)
    partial = connect(limited)
    partial.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ")
    t0 = time.monotonic()
    for s in (silent, partial):
        answer = read_all(s)
        assert answer.startswith(b"HTTP/1.1 408"), answer
        s.close()
    assert time.monotonic() - t0 < 4


def test_oversize_header_is_431(limited: str) -> None:
    s = connect(limited)
    try:
        s.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n")
        for _ in range(64):  # up to 4 MB of one header; the server stops it after 8 KiB
            s.sendall(b"X-Big: " + b"a" * 65536 + b"\r\n")
    except (BrokenPipeError, ConnectionResetError):
        pass
    assert read_all(s).startswith(b"HTTP/1.1 431")
    s.close()


def test_idle_keep_alive_connection_is_closed(limited: str) -> None:
    s = connect(limited)
    s.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
    t0 = time.monotonic()
    answer = read_all(s)  # the response, then the close after the 1 s keep-alive timeout
    assert answer.startswith(b"HTTP/1.1 200") and time.monotonic() - t0 < 4
    s.close()


def test_connections_above_the_cap_get_503_and_health_recovers(limited: str) -> None:
    held = [connect(limited) for _ in range(FAST.max_connections)]
    time.sleep(0.1)
    extra = connect(limited)
    assert read_all(extra, 2).startswith(b"HTTP/1.1 503")
    extra.close()
    for s in held:
        s.close()
    time.sleep(0.2)
    assert httpx.get(limited + "/health").status_code == 200


# ---- item 10 ------------------------------------------------------------------------------
def test_chunked_body_over_the_cap_is_413(serve: Any) -> None:
    with serve(max_body_bytes=1024) as url:

        def chunks() -> Iterator[bytes]:
            for _ in range(8):
                yield b" " * 512

        r = httpx.post(url + CHAT, content=chunks(), headers={"content-type": "application/json"})
        assert r.status_code == 413, r.text


def test_401_carries_a_challenge(serve: Any) -> None:
    with serve(api_key="sekrit") as url:
        r = httpx.post(url + CHAT, json={"messages": []})
        assert r.status_code == 401
        assert r.headers["www-authenticate"].lower().startswith("bearer")


def test_messages_name_the_real_problem(url: str) -> None:
    r = httpx.post(url + CHAT, json={"messages": [{"role": "user", "content": [{"type": "text"}]}]})
    assert r.status_code == 400 and "needs a string 'text'" in r.text, r.text
    r = httpx.post(url + "/v1/responses", json={"input": [{"role": "wizard", "content": "x"}]})
    assert r.status_code == 400 and "role 'wizard'" in r.text, r.text
    r = httpx.post(
        url + "/v1/responses",
        json={"input": [{"role": "user", "content": [{"type": "input_text"}]}]},
    )
    assert r.status_code == 400 and "needs a string 'text'" in r.text, r.text
    msg = {"model": MODEL, "max_tokens": 4, "messages": [{"role": "user", "content": [{}]}]}
    msg["messages"][0]["content"] = [{"type": "text"}]
    r = httpx.post(url + "/v1/messages", json=msg)
    assert r.status_code == 400 and "needs a string 'text'" in r.text, r.text


def test_completion_prompts_of_token_ids_are_checked_against_the_vocabulary(url: str) -> None:
    """A client's token ids outside the vocabulary are a 400 naming `prompt`, one prompt or
    one of several; text prompts tokenize into the vocabulary (not scanned again)."""
    for prompt in ([10**9], [[1, 2], [-1]]):
        r = httpx.post(url + "/v1/completions", json={"prompt": prompt, "max_tokens": 1})
        assert r.status_code == 400, (prompt, r.text)
        assert r.json()["error"]["param"] == "prompt" and "token ids must be in" in r.text
    for prompt in (["fine", "also fine"], [[1, 2], [3]]):
        ok = httpx.post(url + "/v1/completions", json={"prompt": prompt, "max_tokens": 1})
        assert ok.status_code == 200, ok.text


def test_one_request_cannot_take_the_whole_queue(serve: Any) -> None:
    with serve(request_queue_capacity=1024) as url:
        body = {"prompt": ["p"] * 64, "n": 16, "max_tokens": 2}
        r = httpx.post(url + "/v1/completions", json=body)
        assert r.status_code == 400 and "at most 64" in r.text, r.text
        r = httpx.post(url + CHAT, json={"messages": [{"role": "user", "content": "x"}], "n": 65})
        assert r.status_code == 400
        assert httpx.get(url + "/health").json()["queued"] == 0
    with serve(request_queue_capacity=16) as url:  # a connection gets a quarter of the queue
        body = {"prompt": "p", "n": 5, "max_tokens": 2}
        r = httpx.post(url + "/v1/completions", json=body)
        assert r.status_code == 400 and "per connection" in r.text, r.text
        body["n"] = 4
        assert httpx.post(url + "/v1/completions", json=body).status_code == 200


def test_host_allow_list_defaults_to_loopback_names(url: str, serve: Any) -> None:
    port = url.rsplit(":", 1)[1]
    for host in (f"localhost:{port}", f"127.0.0.1:{port}", f"[::1]:{port}", "localhost"):
        assert httpx.get(url + "/health", headers={"host": host}).status_code == 200, host
    for host in ("evil.example", f"attacker.test:{port}", "127.0.0.1.nip.io"):
        r = httpx.get(url + "/health", headers={"host": host})
        assert r.status_code == 400 and "host not allowed" in r.text, host
    with serve(allowed_hosts=["api.example"]) as other:
        r = httpx.get(other + "/health", headers={"host": "api.example:8000"})
        assert r.status_code == 200
        assert httpx.get(other + "/health").status_code == 400  # 127.0.0.1 not listed
