"""The bounded in-memory store behind `previous_response_id` and `GET`/`DELETE
/v1/responses/{id}`.

A response created with `store` left on (the default, as in OpenAI's API) is kept with the
conversation that produced it: its input items (the previous turns included) and its output
items. A request naming it as `previous_response_id` continues that conversation. Entries are
kept as JSON text (a few times smaller than the parsed objects), and the store is bounded both
in entries (`capacity`, 1,024) and in bytes of that text (`max_bytes`, 256 MiB): the oldest
are evicted beyond either, and a response larger than `max_bytes` alone is not stored. Naming
an evicted, unstored, deleted or unknown response is a 404. It lives in the server process: a
restart empties it.

`check_metadata` enforces OpenAI's `metadata` limits: at most 16 pairs, string keys of at
most 64 characters, string values of at most 512.
"""

from __future__ import annotations

import json
import logging
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

from resin.server.errors import ApiError

log = logging.getLogger("resin.server")

MAX_METADATA_PAIRS = 16
MAX_METADATA_KEY = 64
MAX_METADATA_VALUE = 512


@dataclass(frozen=True, slots=True)
class Stored:
    """One stored response, as JSON text (decoded when read)."""

    response_json: str
    conversation_json: str
    """Input items then output items: what a follow-up request continues from."""

    @property
    def response(self) -> dict[str, Any]:
        value: dict[str, Any] = json.loads(self.response_json)
        return value

    @property
    def conversation(self) -> tuple[dict[str, Any], ...]:
        return tuple(json.loads(self.conversation_json))

    @property
    def nbytes(self) -> int:
        return len(self.response_json) + len(self.conversation_json)


class ResponseStore:
    def __init__(self, capacity: int = 1024, max_bytes: int = 256 << 20) -> None:
        self.capacity = capacity
        self.max_bytes = max_bytes
        self._items: OrderedDict[str, Stored] = OrderedDict()
        self._bytes = 0

    @property
    def nbytes(self) -> int:
        """Bytes of JSON text held (at most `max_bytes`)."""
        return self._bytes

    def __len__(self) -> int:
        return len(self._items)

    def put(self, response: dict[str, Any], inputs: list[dict[str, Any]]) -> None:
        conversation = [*inputs, *response["output"]]
        stored = Stored(json.dumps(response), json.dumps(conversation))
        if stored.nbytes > self.max_bytes:
            log.warning("response %s (%d bytes) is larger than the store", response["id"],
                        stored.nbytes)  # fmt: skip
            return
        self._drop(response["id"])
        self._items[response["id"]] = stored
        self._bytes += stored.nbytes
        while len(self._items) > self.capacity or self._bytes > self.max_bytes:
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
        if old is not None:
            self._bytes -= old.nbytes


def check_metadata(metadata: Any) -> None:
    """OpenAI's limits on `metadata` (a 400 naming the field otherwise)."""
    if metadata is None:
        return
    if not isinstance(metadata, dict):
        raise ApiError(400, "metadata must be an object of string values", "metadata")
    if len(metadata) > MAX_METADATA_PAIRS:
        message = f"metadata has {len(metadata)} pairs; at most {MAX_METADATA_PAIRS}"
        raise ApiError(400, message, "metadata")
    for key, value in metadata.items():
        if len(key) > MAX_METADATA_KEY:
            message = f"metadata keys are at most {MAX_METADATA_KEY} characters"
            raise ApiError(400, message, "metadata")
        if not isinstance(value, str):
            raise ApiError(400, "metadata values must be strings", f"metadata.{key}")
        if len(value) > MAX_METADATA_VALUE:
            message = f"metadata values are at most {MAX_METADATA_VALUE} characters"
            raise ApiError(400, message, f"metadata.{key}")
