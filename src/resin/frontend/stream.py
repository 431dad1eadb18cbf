"""Per-request event buffer between the engine actor (producer) and one reader (a handler).

Lives on the event loop: the actor hands over events with `loop.call_soon_threadsafe`
(coalesced: one delivery per loop turn holds every step since the last one). The buffer holds
at most `capacity` deliveries and at most `capacity * 64` events; a client that falls that far
behind (it stopped reading, its socket is full) is cut off (`overflowed`) and its request
aborted, so a slow reader never makes the actor or other clients wait and never holds more
than a bounded amount of memory.
"""

from __future__ import annotations

import asyncio
from collections import deque
from dataclasses import dataclass
from typing import Literal

from resin.events import Event, FinishedEvent
from resin.frontend.errors import ClientTooSlow


@dataclass(frozen=True, slots=True)
class StreamError:
    """The request ended without a FinishedEvent: the engine died, refused it, or shut down."""

    message: str
    kind: Literal["unavailable", "refused", "aborted", "busy"] = "unavailable"
    """`refused`: the engine refused the input (`submit` raised `ValueError`, or its
    constraint failed to compile); `aborted`: the reader aborted it before it reached the
    engine; `busy`: too many constraints were compiling (retry); `unavailable`: the engine
    died or the frontend is stopping."""


StreamItem = list[Event] | StreamError


class RequestStream:
    """A bounded FIFO of event batches for one engine request; closes after its last item."""

    def __init__(self, capacity: int = 64) -> None:
        self.capacity = capacity
        self.request_id: int | None = None  # written by the actor thread once submitted
        self.abort_reason: str | None = None  # why the server (not the client) aborted it
        self.max_events = capacity * 64
        self._items: deque[StreamItem] = deque()
        self._events = 0
        self._ready = asyncio.Event()
        self.overflowed = False
        self.closed = False
        self.cancelled = False
        """Set by the reader's side when it aborts (its client left): the actor checks it
        right before a queued request would enter the engine."""

    def push(self, item: StreamItem) -> bool:
        """Append one batch (event loop thread only). False when the reader is too slow."""
        if self.closed:
            return True
        if isinstance(item, StreamError) or any(isinstance(e, FinishedEvent) for e in item):
            self.closed = True
        elif len(self._items) >= self.capacity or self._events + len(item) > self.max_events:
            self.overflowed = True
            self.closed = True
            self._ready.set()
            return False
        self._items.append(item)
        if not isinstance(item, StreamError):
            self._events += len(item)
        self._ready.set()
        return True

    async def get(self) -> StreamItem:
        """Everything buffered so far, as one batch (a StreamError comes alone, last).

        Raises ClientTooSlow once the buffer overflowed."""
        while not self._items:
            if self.overflowed:
                raise ClientTooSlow("client fell too far behind the engine")
            self._ready.clear()
            await self._ready.wait()
        if isinstance(self._items[0], StreamError):
            return self._items.popleft()
        events: list[Event] = []
        while self._items and not isinstance(self._items[0], StreamError):
            head = self._items.popleft()
            assert not isinstance(head, StreamError)
            events.extend(head)
        self._events = 0
        return events
