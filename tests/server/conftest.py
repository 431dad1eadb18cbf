"""Live servers on a free port with the zero-cost fake engine and the byte ChatML format."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from typing import Any

import httpx
import pytest

from resin.server import HttpServer
from resin.server.launch import free_port, running
from tests.server.doubles import ByteTokenizer, ChatMLFormat, FakeEngine

MODEL = "fake-chatml"


def make_server(engine: FakeEngine | None = None, **kwargs: Any) -> HttpServer:
    tok = ByteTokenizer()
    return HttpServer(
        engine or FakeEngine(),
        ChatMLFormat(tok),
        tokenizer=tok,
        model=MODEL,
        port=free_port(),
        stream_interval=kwargs.pop("stream_interval", 1),
        **kwargs,
    )


@pytest.fixture
def serve() -> Callable[..., AbstractContextManager[str]]:
    """`with serve(engine, **server_kwargs) as url:` runs a server for the block."""

    def start(engine: FakeEngine | None = None, **kwargs: Any) -> AbstractContextManager[str]:
        return running(make_server(engine, **kwargs))

    return start


@pytest.fixture(scope="module")
def url() -> Iterator[str]:
    """One shared server (echo responder) for tests that do not care about its state."""
    with running(make_server()) as base:
        yield base


def serve_loaded(loaded: Any, **kwargs: Any) -> HttpServer:
    """An `HttpServer` over what `resin_app.loading.load` built (every replica's engine)."""
    return HttpServer(
        list(loaded.engines),
        loaded.recipe,
        tokenizer=loaded.tokenizer,
        model=loaded.name,
        port=free_port(),
        context_length=loaded.context_length,
        **kwargs,
    )


def assert_stops_listening(url: str, seconds: float = 10.0) -> None:
    """The server closes its listener within `seconds` (after its engine, or all, died)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            httpx.get(url + "/health", timeout=1)
        except httpx.TransportError:
            return
        time.sleep(0.1)
    pytest.fail("the listener is still up")
