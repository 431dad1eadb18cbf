"""Connection limits uvicorn lacks: a header read timeout, a header size cap, and a hard cap
on open connections (an excess connection is answered 503 and closed at once, so idle or
half-open sockets cannot exhaust file descriptors).

uvicorn's own `timeout_keep_alive` closes an idle connection *after* a response; nothing
closes one that never finishes its headers (slowloris) or never sends a byte. `ConnectionLimits`
adds a timer from the connection's first moment (and from each request's first byte) until
its headers are complete, and counts header bytes as they arrive so an oversize header is
refused (431) before it is buffered whole.

HTTP/1.0 has no chunked encoding, yet uvicorn frames every answer without a Content-Length
(the SSE streams) as chunked. For an HTTP/1.0 request such an answer is sent close-delimited
instead: the body as it comes, then the connection closes (`close_delimited`).
"""

from __future__ import annotations

import asyncio
import resource
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol, RequestResponseCycle


@dataclass(frozen=True, slots=True)
class ConnectionLimits:
    timeout_keep_alive: int = 5
    """Seconds an idle kept-alive connection stays open after its last response."""
    timeout_headers: float = 10.0
    """Seconds a client has to send a request's headers (from connect or its first byte)."""
    max_header_bytes: int = 64 * 1024
    """Request line plus headers; larger gets 431 and the connection is closed."""
    max_connections: int = 1024
    """Open connections at once (clamped below the process's file limit); more get 503."""
    timeout_body: float = 30.0
    """Seconds a client has to send a request's whole body once its headers arrived; a later
    body gets 408 and the connection is closed (`GuardMiddleware`)."""

    def effective_max_connections(self) -> int:
        soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
        if soft == resource.RLIM_INFINITY:
            return self.max_connections
        return max(1, min(self.max_connections, soft - 32))


def _response(status: bytes, message: str) -> bytes:
    body = message.encode()
    return (
        b"HTTP/1.1 " + status + b"\r\ncontent-type: text/plain; charset=utf-8\r\n"
        b"content-length: " + str(len(body)).encode() + b"\r\nconnection: close\r\n\r\n" + body
    )


def close_delimited(cycle: RequestResponseCycle) -> Callable[[Any], Awaitable[None]]:
    """`cycle.send` for an HTTP/1.0 request: an answer without a Content-Length is written as
    it comes (no chunk framing) and ends when the connection closes."""
    plain = cycle.send
    raw = False

    async def send(message: Any) -> None:
        nonlocal raw
        if message["type"] == "http.response.start" and not cycle.response_started:
            names = {bytes(k).lower() for k, _ in message.get("headers", [])}
            raw = b"content-length" not in names and cycle.scope["method"] != "HEAD"
            if raw:
                cycle.chunked_encoding = False  # uvicorn then adds no transfer-encoding
            await plain(message)
            return
        if not raw or message["type"] != "http.response.body" or cycle.response_complete:
            await plain(message)
            return
        if cycle.flow.write_paused and not cycle.disconnected:
            await cycle.flow.drain()
        if cycle.disconnected:
            return
        cycle.transport.write(message.get("body", b""))
        if not message.get("more_body", False):
            cycle.response_complete = True
            cycle.message_event.set()
            cycle.transport.close()
            cycle.on_response()

    return send


def protocol_class(limits: ConnectionLimits) -> type[HttpToolsProtocol]:
    """An httptools protocol class enforcing `limits` (pass as uvicorn's `http=`)."""
    max_open = limits.effective_max_connections()

    class LimitedHttpToolsProtocol(HttpToolsProtocol):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self._in_headers = True
            self._header_bytes = 0
            self._header_timer: asyncio.TimerHandle | None = None

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            if len(self.connections) > max_open:
                transport.write(_response(b"503 Service Unavailable", "too many connections"))
                transport.close()
                return
            self._arm()

        def connection_lost(self, exc: Exception | None) -> None:
            self._disarm()
            super().connection_lost(exc)

        def _arm(self) -> None:
            if self._header_timer is None:
                self._header_timer = self.loop.call_later(
                    limits.timeout_headers, self._headers_timed_out
                )

        def _disarm(self) -> None:
            if self._header_timer is not None:
                self._header_timer.cancel()
                self._header_timer = None

        def _headers_timed_out(self) -> None:
            self._header_timer = None
            if self._in_headers and not self.transport.is_closing():
                self.transport.write(_response(b"408 Request Timeout", "request headers too slow"))
                self.transport.close()

        def data_received(self, data: bytes) -> None:
            if self.transport.is_closing():
                return
            if self._in_headers:
                self._header_bytes += len(data)
            super().data_received(data)
            too_big = self._in_headers and self._header_bytes > limits.max_header_bytes
            if too_big and not self.transport.is_closing():
                message = f"request headers larger than {limits.max_header_bytes} bytes"
                self.transport.write(_response(b"431 Request Header Fields Too Large", message))
                self.transport.close()

        def on_message_begin(self) -> None:
            super().on_message_begin()
            self._in_headers = True
            self._header_bytes = 0
            self._arm()

        def on_headers_complete(self) -> None:
            self._in_headers = False
            self._disarm()
            super().on_headers_complete()
            cycle = self.cycle
            if (
                cycle is not None
                and cycle.scope is self.scope
                and self.scope["http_version"] == "1.0"
            ):
                cycle.send = close_delimited(cycle)  # type: ignore[method-assign,assignment]

    return LimitedHttpToolsProtocol
