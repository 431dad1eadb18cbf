"""`resin serve`'s start: the port is taken first and answers 503 `loading` while the model
loads, then the server takes the same listening socket over.

`Readiness` is the state `/health` reports before the server exists (`loading`, with the
step under way). A `Listener` binds the port at once (a port in use fails before any weights
load) and serves a small loading app on it from a thread: every path answers 503 (`/health`:
`{"status": "loading", "stage": ...}`, an API path: the OpenAI error shape with
`Retry-After`). When the model is loaded and warm, `serve_after_loading` stops the loading
app and runs the real server on the same socket: connections that arrive in between wait in
the listen backlog, so a client polling `/health` sees 503 until it sees 200, never a refused
connection. A failed start closes the socket: nothing half-started keeps the port.
"""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

STOP_WAIT_S = 10.0

GC_GEN0_THRESHOLD = 10_000
"""Allocations between young-generation collections once serving (Python's default: 700)."""


def settle_heap() -> None:
    """Once a server process has loaded, before it serves: collect, then move every object
    alive now (modules, the tokenizer, the model's tables) out of the collector's reach, and
    collect the young generation less often. Serving allocates a few small objects per token
    (events, deltas, chunks) that die young; with the defaults, collections that scan the
    whole startup heap took ~19% of a frontend's CPU at 256 zero-cost streams (dev CPU), and
    about a third of that after this. vLLM's engine core freezes its startup heap too."""
    import atexit
    import gc

    gc.collect()
    gc.freeze()
    _, older, oldest = gc.get_threshold()
    gc.set_threshold(GC_GEN0_THRESHOLD, older, oldest)
    # At exit the heap is the collector's again: frozen objects are never freed, and nanobind
    # modules (triton's) would report each of theirs as a leak.
    atexit.register(gc.unfreeze)


@dataclass
class Readiness:
    """What the port says while the model loads: `stage` is the step under way."""

    stage: str = "starting"

    def set(self, stage: str) -> None:
        self.stage = stage

    def body(self) -> dict[str, str]:
        return {"status": "loading", "stage": self.stage}


def loading_app(readiness: Readiness) -> Callable[..., Any]:
    """The ASGI app of a server still loading: 503 on every path."""

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        if scope["path"] == "/health":
            payload: dict[str, Any] = readiness.body()
        else:
            message = f"the model is loading ({readiness.stage}); retry shortly"
            payload = {
                "error": {
                    "message": message,
                    "type": "server_error",
                    "param": None,
                    "code": "service_unavailable",
                }
            }
        body = json.dumps(payload).encode()
        headers = [
            (b"content-type", b"application/json"),
            (b"content-length", str(len(body)).encode()),
            (b"retry-after", b"1"),
        ]
        await send({"type": "http.response.start", "status": 503, "headers": headers})
        await send({"type": "http.response.body", "body": body})

    return app


class Listener:
    """The bound, listening socket of `host:port`, answering 503 `loading` until handed over."""

    def __init__(self, host: str, port: int, backlog: int = 4096) -> None:
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self.socket = socket.socket(family, socket.SOCK_STREAM)
        self.socket.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            self.socket.bind((host, port))
            self.socket.listen(backlog)
        except OSError:
            self.socket.close()
            raise
        self.readiness = Readiness()
        self._loading: Any = None
        self._thread: threading.Thread | None = None

    @property
    def port(self) -> int:
        return int(self.socket.getsockname()[1])

    def answer_loading(self) -> None:
        """Serve the loading app on (a duplicate of) the socket, from a thread."""
        import uvicorn

        config = uvicorn.Config(
            loading_app(self.readiness), log_level="warning", lifespan="off", workers=1
        )
        self._loading = uvicorn.Server(config)
        sockets = [self.socket.dup()]
        self._thread = threading.Thread(
            target=self._loading.run, kwargs={"sockets": sockets}, name="resin-loading"
        )
        self._thread.daemon = True
        self._thread.start()
        deadline = time.monotonic() + STOP_WAIT_S
        while not self._loading.started and self._thread.is_alive():
            if time.monotonic() > deadline:
                raise RuntimeError("the loading responder did not start")
            time.sleep(0.01)

    def stop_loading(self) -> None:
        """Stop the loading app (its socket duplicate closes; this one keeps listening)."""
        if self._loading is not None and self._thread is not None:
            self._loading.should_exit = True
            self._thread.join(STOP_WAIT_S)
        self._loading = self._thread = None

    def close(self) -> None:
        self.stop_loading()
        self.socket.close()


def serve_after_loading(
    listener: Listener,
    load: Callable[[Readiness], Any],
    make_server: Callable[[Any], Any],
    on_ready: Callable[[Any, Any], None] | None = None,
) -> int:
    """Answer `loading` on `listener` while `load(readiness)` runs, then serve
    `make_server(loaded)` (an `HttpServer`) on the same socket until it stops
    (`on_ready(loaded, uvicorn_server)` just before it starts). The loaded
    object's `close()` runs at the end; the socket closes whatever happens. Returns 130 after
    Ctrl-C, else 0; `load`'s errors propagate after the port is released."""
    loaded = None
    try:
        listener.answer_loading()
        loaded = load(listener.readiness)
        server = make_server(loaded)
        uv = server.make_uvicorn()
        settle_heap()
        listener.stop_loading()
        if on_ready is not None:
            on_ready(loaded, uv)
        uv.run(sockets=[listener.socket])
        return 0
    except KeyboardInterrupt:  # Ctrl-C while loading, or uvicorn re-raising SIGINT after its
        return 130  # clean shutdown: no traceback
    finally:
        listener.close()
        if loaded is not None:
            loaded.close()
