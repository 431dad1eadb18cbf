"""Pure-ASGI pieces (no BaseHTTPMiddleware): the auth + body-size guard, an SSE response that
aborts its generation the moment the client disconnects, and a disconnect-aware await for
non-streaming handlers."""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar

from starlette.requests import Request
from starlette.responses import Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from resin.server.errors import ApiError, error_body
from resin.server.stream import ClientTooSlow

T = TypeVar("T")
log = logging.getLogger("resin.server")
OPEN_PATHS = ("/health", "/", "/favicon.ico")


class ClientDisconnected(Exception):
    """The client went away before the answer was ready."""


class _BodyTooLarge(Exception):
    pass


class GuardMiddleware:
    """Checks the API key (Bearer or x-api-key, constant time) and caps the body size."""

    def __init__(self, app: ASGIApp, api_key: str | None, max_body_bytes: int) -> None:
        self.app = app
        self.api_key = api_key
        self.max_body_bytes = max_body_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path = str(scope.get("path", ""))
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        if self.api_key and not _open(path) and not self._authorized(headers):
            await _send_error(send, path, 401, "invalid or missing API key")
            return
        declared = headers.get("content-length", "")
        if declared.isdigit() and int(declared) > self.max_body_bytes:
            await _send_error(send, path, 413, f"body larger than {self.max_body_bytes} bytes")
            return
        started = False
        seen = 0

        async def counted_receive() -> Message:
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.max_body_bytes:
                    raise _BodyTooLarge
            return message

        async def tracked_send(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, counted_receive, tracked_send)
        except _BodyTooLarge:
            if not started:
                await _send_error(send, path, 413, f"body larger than {self.max_body_bytes} bytes")
        except Exception:
            # Starlette re-raises after its 500 answer; uvicorn would then drop the socket
            # under a client that may reuse it. The answer went out: log and end here.
            if not started:
                raise
            log.exception("request failed after its answer started")

    def _authorized(self, headers: dict[str, str]) -> bool:
        assert self.api_key is not None
        bearer = headers.get("authorization", "")
        given = bearer[7:] if bearer.lower().startswith("bearer ") else headers.get("x-api-key", "")
        return hmac.compare_digest(given.encode(), self.api_key.encode())


def _open(path: str) -> bool:
    return path in OPEN_PATHS or path.startswith("/static/")


async def _send_error(send: Send, path: str, status: int, message: str) -> None:
    body = json.dumps(error_body(path, status, message)).encode()
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [(b"content-type", b"application/json")],
        }
    )
    await send({"type": "http.response.body", "body": body})


class SSEResponse(Response):
    """Streams `events` (already formatted SSE frames) and watches for http.disconnect.

    On disconnect the generator is closed at once (`aclose`), which aborts its engine
    request; the generator is closed in every case, so no request outlives its client.
    """

    media_type = "text/event-stream"

    def __init__(
        self,
        events: AsyncIterator[str],
        on_close: Callable[[], None] | None = None,
        error_frame: Callable[[str], str] | None = None,
    ) -> None:
        self.status_code = 200
        self.background = None
        self.raw_headers = [
            (b"content-type", b"text/event-stream; charset=utf-8"),
            (b"cache-control", b"no-cache"),
            (b"x-accel-buffering", b"no"),
        ]
        self.events = events
        self.on_close = on_close
        self.error_frame = error_frame or openai_error_frame

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        pump = asyncio.ensure_future(self._pump(send))
        watch = asyncio.ensure_future(_wait_disconnect(receive))
        try:
            await asyncio.wait({pump, watch}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in (pump, watch):
                task.cancel()
            await asyncio.gather(pump, watch, return_exceptions=True)
            await _close(self.events)
            if self.on_close is not None:
                self.on_close()  # abort what the generator did not finish

    async def _pump(self, send: Send) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": self.raw_headers})
        try:
            async for frame in self.events:
                await send(
                    {"type": "http.response.body", "body": frame.encode(), "more_body": True}
                )
                # A send into a transport that is not full never suspends: yield, so a
                # backlog of buffered frames cannot monopolize the event loop.
                await asyncio.sleep(0)
            await send({"type": "http.response.body", "body": b"", "more_body": False})
        except OSError:
            return  # the client went away while we wrote
        except ClientTooSlow:
            # The reader fell too far behind; its request is already aborted. Say so (an error
            # event in the API's shape), so the cut answer is never taken for a complete one.
            frame = self.error_frame("client fell too far behind; the answer was cut off")
            await send({"type": "http.response.body", "body": frame.encode(), "more_body": True})
            await send({"type": "http.response.body", "body": b"", "more_body": False})
        except Exception:
            log.exception("stream failed")
            raise


def openai_error_frame(message: str) -> str:
    return sse({"error": {"message": message, "type": "server_error", "code": 503}})


async def _close(events: AsyncIterator[str]) -> None:
    aclose = getattr(events, "aclose", None)
    if aclose is not None:
        await aclose()


async def _wait_disconnect(receive: Receive) -> None:
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return


async def until_disconnect(request: Request, work: Awaitable[T]) -> T:
    """Await `work`; if the client disconnects first, cancel it (aborting its generations)."""
    task: asyncio.Future[T] = asyncio.ensure_future(work)
    watch: asyncio.Future[None] = asyncio.ensure_future(_wait_disconnect(request.receive))
    pair: list[asyncio.Future[Any]] = [task, watch]
    try:
        await asyncio.wait(pair, return_when=asyncio.FIRST_COMPLETED)
    finally:
        watch.cancel()
    if not task.done():
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        raise ClientDisconnected
    return task.result()


def sse(data: Any, event: str | None = None) -> str:
    """One SSE frame; `data` is JSON-encoded unless it is already a string."""
    payload = data if isinstance(data, str) else json.dumps(data, separators=(",", ":"))
    head = f"event: {event}\n" if event else ""
    return f"{head}data: {payload}\n\n"


def raise_api(status: int, message: str, param: str | None = None) -> None:
    raise ApiError(status, message, param)
