"""Run an `HttpServer` on a background thread (tests, notebooks, `resin chat`)."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

from resin.server.app import HttpServer


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


@contextmanager
def running(server: HttpServer, timeout: float = 30.0) -> Iterator[str]:
    """Serve on a thread; yield the base URL once ready; shut down cleanly on exit."""
    uv = server.make_uvicorn()
    thread = threading.Thread(target=uv.run, name="resin-http", daemon=True)
    thread.start()
    deadline = time.monotonic() + timeout
    while not uv.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError("server did not start")
        time.sleep(0.02)
    try:
        yield f"http://{server.host}:{server.port}"
    finally:
        server.shutdown()
        thread.join(timeout)
