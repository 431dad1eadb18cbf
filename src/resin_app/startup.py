"""`resin serve`'s start: the port is taken first and answers 503 `loading` while the model
loads, then the server takes the same listening socket over.

`Readiness` is the state `/health` reports before the server exists (`loading`, with the
step under way). A `Listener` binds the port at once (a port in use fails before any weights
load) and answers on it from threads: every path answers 503 (`/health`:
`{"status": "loading", "stage": ...}`, an API path: the OpenAI error shape with
`Retry-After`), one request per connection. When the model is loaded and warm,
`serve_after_loading` stops the loading answer (every connection it accepted is answered
first) and runs the real server on the same socket: connections that arrive in between wait
in the listen backlog, so a client polling `/health` sees 503 until it sees 200, never a
refused or dropped connection. A failed start closes the socket: nothing half-started keeps
the port.
"""

from __future__ import annotations

import json
import os
import select
import socket
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

STOP_WAIT_S = 10.0
READ_TIMEOUT_S = 5.0
"""How long the loading answer waits for a request's head (in all), then for the client to
close."""
MAX_HEAD_BYTES = 64 * 1024
ANSWER_THREADS = 8

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


def loading_answer(readiness: Readiness, method: str, path: str) -> bytes:
    """The whole HTTP response of a server still loading: 503 on every path (`/health`: the
    stage under way; any other path: the OpenAI error shape), `Retry-After: 1`, and the
    connection closes after it."""
    if path.split("?", 1)[0] == "/health":
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
    head = (
        "HTTP/1.1 503 Service Unavailable\r\n"
        "content-type: application/json\r\n"
        f"content-length: {len(body)}\r\n"
        "retry-after: 1\r\n"
        "connection: close\r\n\r\n"
    ).encode()
    return head if method == "HEAD" else head + body


class Listener:
    """The bound, listening socket of `host:port`, answering 503 `loading` until handed over.

    The loading answer runs on threads: one accepts (it waits on the socket and on a stop
    pipe, and accepts only while not stopped), a few answer one request per connection. Its
    stop is a drain, not a cut: every connection it accepted gets its 503 before the stop
    returns, and connections it did not accept stay in the listen backlog for the server that
    takes the socket over. (With uvicorn as the loading answer, its shutdown closed
    connections whose request it had not read yet: a client polling `/health` through the
    handover saw "server disconnected" about once in a hundred handovers on a loaded box.)"""

    def __init__(self, host: str, port: int, backlog: int = 4096) -> None:
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self.socket = socket.socket(family, socket.SOCK_STREAM)
        self.socket.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            self.socket.bind((host, port))
            self.socket.listen(backlog)
            # Accepting never blocks (the loading answer accepts only after a poll says a
            # connection waits; whoever serves on the socket next sets this too).
            self.socket.setblocking(False)
        except OSError:
            self.socket.close()
            raise
        self.readiness = Readiness()
        self._thread: threading.Thread | None = None
        self._stop_pipe: tuple[int, int] | None = None
        self.accepted = 0
        """Connections the loading answer has accepted (each gets its 503)."""

    @property
    def port(self) -> int:
        return int(self.socket.getsockname()[1])

    def answer_loading(self) -> None:
        """Answer 503 `loading` on the socket from threads until `stop_loading`."""
        self._stop_pipe = os.pipe()
        self._thread = threading.Thread(
            target=self._accept, args=(self._stop_pipe[0],), name="resin-loading", daemon=True
        )
        self._thread.start()

    def _accept(self, stop: int) -> None:
        poll = select.poll()  # not select(): a loading process may hold fds past 1024
        poll.register(stop, select.POLLIN)
        poll.register(self.socket, select.POLLIN)
        with ThreadPoolExecutor(ANSWER_THREADS, thread_name_prefix="resin-loading") as answers:
            while True:
                ready = {fd for fd, _ in poll.poll()}
                if stop in ready:  # checked first: once stopping, nothing more is accepted
                    return  # leaving the pool waits for every accepted connection's answer
                try:
                    connection, _ = self.socket.accept()
                except (BlockingIOError, InterruptedError):
                    continue
                except OSError:
                    return  # the socket closed under us
                self.accepted += 1
                answers.submit(self._respond, connection)

    def _respond(self, connection: socket.socket) -> None:
        deadline = time.monotonic() + READ_TIMEOUT_S  # for the head, then for the close

        def received() -> bytes:
            connection.settimeout(max(deadline - time.monotonic(), 0.001))
            return connection.recv(65536)

        with connection:
            try:
                head = b""
                while b"\r\n\r\n" not in head and len(head) < MAX_HEAD_BYTES:
                    chunk = received()
                    if not chunk:
                        return  # the client hung up before asking
                    head += chunk
                # a request line that is not `METHOD PATH ...` still gets the 503 of an API path
                line = head.split(b"\r\n", 1)[0].decode("latin-1")
                method, path, *_ = [*line.split(" "), "/"]
                connection.sendall(loading_answer(self.readiness, method, path))
                # Close once the client has read and closed (it was told `connection: close`):
                # closing over an unread request body would reset the connection.
                connection.shutdown(socket.SHUT_WR)
                deadline = time.monotonic() + READ_TIMEOUT_S
                while received():
                    pass
            except OSError:
                pass  # a client that hung up or was slow: nothing more to say

    def stop_loading(self) -> None:
        """Stop the loading answer once its accepted connections are answered; the socket
        keeps listening."""
        if self._thread is not None and self._stop_pipe is not None:
            os.write(self._stop_pipe[1], b"x")
            self._thread.join(STOP_WAIT_S)
            for fd in self._stop_pipe:
                os.close(fd)
        self._thread = self._stop_pipe = None

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
