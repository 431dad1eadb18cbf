"""The Responses store the frontend processes of `resin serve` share (`serve_split.py`).

A stored response (`previous_response_id`, `GET`/`DELETE /v1/responses/{id}`) must be found
whichever frontend the kernel hands the next connection to, so with two frontends or more one
`ResponseStore` lives in the supervisor, served by a `multiprocessing` manager on a Linux
abstract socket (no file to remove, whatever ends the processes) and a random key; each
frontend's server holds a proxy. A call is one round trip on that socket (tens of
microseconds), made only by the Responses endpoints. One frontend keeps its own store.
"""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass
from multiprocessing.managers import BaseManager
from typing import Any, cast

from resin.server.response_store import Responses, ResponseStore, Stored


class _Locked:
    """A `ResponseStore` behind a lock: the manager serves each frontend on its own thread."""

    def __init__(self) -> None:
        self._store = ResponseStore()
        self._lock = threading.Lock()

    def put(self, response: dict[str, Any], inputs: list[dict[str, Any]]) -> None:
        with self._lock:
            self._store.put(response, inputs)

    def get(self, response_id: str, param: str | None = None) -> Stored:
        with self._lock:
            return self._store.get(response_id, param)

    def delete(self, response_id: str) -> None:
        with self._lock:
            self._store.delete(response_id)


_METHODS = ("put", "get", "delete")


class _Host(BaseManager):
    pass


class _Client(BaseManager):
    pass


_Client.register("responses", exposed=_METHODS)


@dataclass(frozen=True)
class Address:
    """Where the frontends find the store (passed to them at spawn)."""

    address: str
    authkey: bytes


def host() -> Address:
    """Serve one store from this process (the supervisor) on daemon threads, for its life."""
    store = _Locked()
    _Host.register("responses", callable=lambda: store, exposed=_METHODS)
    where = Address(f"\0resin-responses-{os.getpid()}-{os.urandom(6).hex()}", os.urandom(32))
    server = _Host(address=where.address, authkey=where.authkey).get_server()
    threading.Thread(target=server.serve_forever, name="resin-responses", daemon=True).start()
    return where


def connect(where: Address) -> Responses:
    """The store, from a frontend process."""
    client = _Client(address=where.address, authkey=where.authkey)
    client.connect()
    return cast(Responses, client.responses())  # type: ignore[attr-defined]
