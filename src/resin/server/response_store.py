"""The bounded in-memory store behind `previous_response_id` and `GET`/`DELETE
/v1/responses/{id}`.

A response created with `store` left on (the default, as in OpenAI's API) is kept with the
conversation that produced it: its input items (the previous turns included) and its output
items. A request naming it as `previous_response_id` continues that conversation. Entries are
kept as JSON text (a few times smaller than the parsed objects); the store holds the newest
`capacity` (1,024) within `max_bytes` of that text (256 MiB), evicting the oldest beyond
either; a response larger than `max_bytes` alone is not stored. Naming an evicted, unstored,
deleted or unknown response is a 404. It lives in the server process: a restart empties it.
The frontend processes of `resin serve` share one, kept in its supervisor
(`resin_app/shared_store.py`), so any frontend finds a response another one stored.
"""

from __future__ import annotations

import json
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Protocol

from resin.server.errors import ApiError


@dataclass(frozen=True, slots=True)
class Stored:
    response_json: str
    conversation_json: str
    """Input items then output items: what a follow-up request continues from."""

    @property
    def response(self) -> dict[str, Any]:
        return dict(json.loads(self.response_json))

    @property
    def conversation(self) -> tuple[dict[str, Any], ...]:
        return tuple(json.loads(self.conversation_json))

    @property
    def nbytes(self) -> int:
        return len(self.response_json) + len(self.conversation_json)


class Responses(Protocol):
    """What the server asks of a response store (`ResponseStore`, or a proxy of one another
    process keeps)."""

    def put(self, response: dict[str, Any], inputs: list[dict[str, Any]]) -> None: ...

    def get(self, response_id: str, param: str | None = None) -> Stored: ...

    def delete(self, response_id: str) -> None: ...


class ResponseStore:
    def __init__(self, capacity: int = 1024, max_bytes: int = 256 << 20) -> None:
        self.capacity = capacity
        self.max_bytes = max_bytes
        self.nbytes = 0
        """Bytes of JSON text held (at most `max_bytes`)."""
        self._items: OrderedDict[str, Stored] = OrderedDict()

    def put(self, response: dict[str, Any], inputs: list[dict[str, Any]]) -> None:
        stored = Stored(json.dumps(response), json.dumps([*inputs, *response["output"]]))
        if stored.nbytes <= self.max_bytes:
            self._drop(response["id"])
            self._items[response["id"]] = stored
            self.nbytes += stored.nbytes
        while len(self._items) > self.capacity or self.nbytes > self.max_bytes:
            self._drop(next(iter(self._items)))

    def get(self, response_id: str, param: str | None = None) -> Stored:
        stored = self._items.get(response_id)
        if stored is None:
            raise ApiError(
                404, f"response {response_id!r} not found (never stored, or evicted)", param
            )
        return stored

    def delete(self, response_id: str) -> None:
        self.get(response_id)
        self._drop(response_id)

    def _drop(self, response_id: str) -> None:
        old = self._items.pop(response_id, None)
        self.nbytes -= 0 if old is None else old.nbytes
