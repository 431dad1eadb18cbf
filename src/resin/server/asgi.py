"""Pure-ASGI pieces (no BaseHTTPMiddleware): the auth + body-size guard, an SSE response that
aborts its generation the moment the client disconnects, and a disconnect-aware await for
non-streaming handlers."""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
import re
from collections.abc import AsyncGenerator, Awaitable, Callable, Collection
from typing import Any, TypeVar

from starlette.requests import Request
from starlette.responses import Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from resin.frontend.errors import ClientTooSlow, constraint_failed
from resin.server.errors import ClientDisconnected, error_body

T = TypeVar("T")
log = logging.getLogger("resin.server")
OPEN_PATHS = ("/health", "/", "/favicon.ico")


class GuardMiddleware:
    """Refuses a repeated Host, Authorization, x-api-key or Content-Length header (400), checks
    the Host header against `allowed_hosts` (None: any), the API key (Bearer or x-api-key,
    constant time) and the body size: the body is read here, up to the cap, so an
    oversize body is a 413 however it is framed (Content-Length or chunked). The whole body
    must arrive within `body_timeout_s`, else 408 and the connection closes: a client that
    trickles its body a byte at a time holds its connection slot that long at most."""

    def __init__(
        self,
        app: ASGIApp,
        api_key: str | None,
        max_body_bytes: int,
        allowed_hosts: Collection[str] | None = None,
        body_timeout_s: float = 30.0,
    ) -> None:
        self.app = app
        self.body_timeout_s = body_timeout_s
        self.api_key = api_key
        self.max_body_bytes = max_body_bytes
        self.allowed_hosts = None if allowed_hosts is None else {h.lower() for h in allowed_hosts}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path = str(scope.get("path", ""))
        names = [k.decode("latin-1").lower() for k, _ in scope["headers"]]
        twice = next((n for n in SINGLE_HEADERS if names.count(n) > 1), None)
        if twice is not None:
            await _send_error(send, path, 400, f"more than one {twice} header")
            return
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        if not self._host_allowed(headers.get("host")):
            await _send_error(send, path, 400, "host not allowed (see --allowed-hosts)")
            return
        if self.api_key and not _open(path) and not self._authorized(headers):
            auth = {"www-authenticate": 'Bearer realm="resin"'}
            await _send_error(send, path, 401, "invalid or missing API key", auth)
            return
        too_large = f"body larger than {self.max_body_bytes} bytes"
        declared = headers.get("content-length", "")
        if declared.isdigit() and int(declared) > self.max_body_bytes:
            await _send_error(send, path, 413, too_large)
            return
        body: list[bytes] = []
        seen = 0
        more = scope.get("method") not in ("GET", "HEAD")
        try:
            async with asyncio.timeout(self.body_timeout_s):
                while more:
                    message = await receive()
                    if message["type"] != "http.request":
                        return  # the client left before its body arrived
                    chunk = message.get("body", b"")
                    seen += len(chunk)
                    if seen > self.max_body_bytes:
                        await _send_error(send, path, 413, too_large)
                        return
                    body.append(chunk)
                    more = bool(message.get("more_body", False))
        except TimeoutError:
            late = f"the request body did not arrive within {self.body_timeout_s:g} s"
            await _send_error(send, path, 408, late, {"connection": "close"})
            return
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": b"".join(body), "more_body": False}
            return await receive()

        started = False

        async def tracked_send(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, replay, tracked_send)
        except Exception:
            # Starlette re-raises after its 500 answer; uvicorn would then drop the socket
            # under a client that may reuse it. The answer went out: log and end here.
            if not started:
                raise
            log.exception("request failed after its answer started")

    def _host_allowed(self, host: str | None) -> bool:
        """`host` is `name[:port]` (a bracketed IPv6 literal too) with `name` in the list;
        anything else (userinfo, a path, a port that is not a number) is refused."""
        if self.allowed_hosts is None or "*" in self.allowed_hosts or host is None:
            return True
        match = _HOST.fullmatch(host.strip().lower())
        if match is None:
            return False
        name = match.group(1)
        return name in self.allowed_hosts or name.strip("[]") in self.allowed_hosts

    def _authorized(self, headers: dict[str, str]) -> bool:
        assert self.api_key is not None
        bearer = headers.get("authorization", "")
        given = bearer[7:] if bearer.lower().startswith("bearer ") else headers.get("x-api-key", "")
        return hmac.compare_digest(given.encode(), self.api_key.encode())


LOOPBACK_HOSTS = ("localhost", "127.0.0.1", "::1")
SINGLE_HEADERS = ("host", "authorization", "x-api-key", "content-length")
"""Headers a request may carry once: with two, which one counts is up to each proxy."""
_HOST = re.compile(r"(\[[0-9a-f:.]+\]|[a-z0-9._-]+)(?::[0-9]{1,5})?")


def default_allowed_hosts(bound: str) -> list[str] | None:
    """Loopback names when the server listens on a loopback address (DNS rebinding cannot
    reach it through another name); any host otherwise."""
    if bound in LOOPBACK_HOSTS or bound.startswith("127.") or bound == "[::1]":
        return list(LOOPBACK_HOSTS)
    return None


def _open(path: str) -> bool:
    return path in OPEN_PATHS or path.startswith("/static/")


async def _send_error(
    send: Send, path: str, status: int, message: str, extra: dict[str, str] | None = None
) -> None:
    body = json.dumps(error_body(path, status, message)).encode()
    headers = [(b"content-type", b"application/json")]
    headers += [(b"content-length", str(len(body)).encode())]
    headers += [(k.encode(), v.encode()) for k, v in (extra or {}).items()]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


class SSEResponse(Response):
    """Streams `events` (already formatted SSE frames) and watches for http.disconnect.

    On disconnect the generator is closed at once (`aclose`), which aborts its engine
    request; the generator is closed in every case, so no request outlives its client.
    """

    media_type = "text/event-stream"

    def __init__(
        self,
        events: AsyncGenerator[str, None],
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
            await self.events.aclose()
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
    """A stream's last frame when it is cut off: the server's fault (retry), or the
    client's constraint that failed mid-answer (an invalid request, as its 400 would be)."""
    if constraint_failed(message):
        return sse({"error": {"message": message, "type": "invalid_request_error", "code": None}})
    return sse(
        {"error": {"message": message, "type": "server_error", "code": "service_unavailable"}}
    )


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
