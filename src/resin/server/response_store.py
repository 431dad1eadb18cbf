"""The bounded in-memory store behind `previous_response_id` and `GET`/`DELETE
/v1/responses/{id}`.

A response created with `store` left on (the default, as in OpenAI's API) is kept with the
conversation that produced it: its input items (the previous turns included) and its output
items. A request naming it as `previous_response_id` continues that conversation. The store
holds the newest `capacity` responses (1,024 by default) and evicts the oldest beyond that;
naming an evicted, deleted or unknown response is a 404. It lives in the server process: a
restart empties it.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

from resin.server.errors import ApiError


@dataclass(frozen=True, slots=True)
class Stored:
    response: dict[str, Any]
    conversation: tuple[dict[str, Any], ...]
    """Input items then output items: what a follow-up request continues from."""


class ResponseStore:
    def __init__(self, capacity: int = 1024) -> None:
        self.capacity = capacity
        self._items: OrderedDict[str, Stored] = OrderedDict()

    def put(self, response: dict[str, Any], inputs: list[dict[str, Any]]) -> None:
        conversation = (*inputs, *response["output"])
        self._items[response["id"]] = Stored(response, conversation)
        while len(self._items) > self.capacity:
            self._items.popitem(last=False)

    def get(self, response_id: str, param: str | None = None) -> Stored:
        stored = self._items.get(response_id)
        if stored is None:
            raise ApiError(
                404, f"response {response_id!r} not found (never stored, or evicted)", param
            )
        return stored

    def delete(self, response_id: str) -> None:
        self.get(response_id)
        del self._items[response_id]
