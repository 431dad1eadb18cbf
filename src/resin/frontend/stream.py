"""Per-request event buffer between the engine actor (producer) and one reader (a handler).

Lives on the event loop: the actor hands over each engine turn's events with
`loop.call_soon_threadsafe`, and the buffer is the one place they coalesce: consecutive plain
token events (no logprobs) become one event of their tokens as they arrive, so the parser
decodes a batch's tokens in one `feed` (parsers are split-invariant: the text is the same),
and the reader takes everything buffered in one `get`, once it holds the reader's
`stream_interval` tokens (the only place a chunk's framing is decided). (A frontend process
reads every engine message waiting on its socket as one, `wire.unpack_many`, so a request's
tokens of those steps may already arrive as one event: how the transport is read, framing
nothing.) The buffer holds at
most `capacity` deliveries and at most `capacity * 64` events that the reader could have
taken; a client that falls that far behind (it stopped reading, its socket is full) is cut
off (`overflowed`) and its request aborted, so a slow reader never makes the actor or other
clients wait and never holds more than a bounded amount of memory.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Literal

from resin.events import Event, FinishedEvent, TokensEvent
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
    """The one place a request's streamed events coalesce: the engine thread's deliveries
    append to one buffer (a run of plain token events kept as one event), and the reader
    takes all of it at once (`get`), as soon as it holds `min_tokens` new tokens or an end.
    Closes after its last item."""

    def __init__(self, capacity: int = 64) -> None:
        self.capacity = capacity
        self.request_id: int | None = None  # written by the actor thread once submitted
        self.abort_reason: str | None = None  # why the server (not the client) aborted it
        self.max_events = capacity * 64
        self._events: list[Event] = []
        self._run: list[TokensEvent] = []  # plain token events after `_events`, to merge
        self._count = 0  # events pushed since the reader last took the buffer
        self._tokens = 0
        self._pushes = 0  # deliveries since the reader last took the buffer
        self._delivery: int | None = None  # the producer's number of the last one
        self._end: StreamError | None = None
        self._want = 0  # tokens the waiting reader asked for (0: none is waiting)
        self._ready = asyncio.Event()
        self.overflowed = False
        self.closed = False
        self.cancelled = False
        """Set by the reader's side when it aborts (its client left): the actor checks it
        right before a queued request would enter the engine."""

    def push(self, item: StreamItem, delivery: int | None = None) -> bool:
        """Append one item (event loop thread only); the items of one `delivery` (a number
        the producer gives each of its hand-overs) count as one. False when the reader is
        too slow: it left `capacity` deliveries or `max_events` events unread while not
        waiting for more."""
        if self.closed:
            return True
        if isinstance(item, StreamError):
            self.closed = True
            self._end = item
            self._ready.set()
            return True
        finished = any(isinstance(e, FinishedEvent) for e in item)
        behind = self._want == 0 or self._tokens >= self._want
        same = delivery is not None and delivery == self._delivery
        full = (self._pushes >= self.capacity and not same) or (
            self._count + len(item) > self.max_events
        )
        if not finished and behind and full:
            self.overflowed = True
            self.closed = True
            self._ready.set()
            return False
        self.closed = finished
        self._count += len(item)
        for event in item:
            if type(event) is TokensEvent:
                self._tokens += len(event.token_ids)
                if event.logprobs is None and event.prompt_logprobs is None:
                    self._run.append(event)
                    continue
            self._close_run()
            self._events.append(event)
        if not same or not self._pushes:
            self._pushes += 1
        self._delivery = delivery
        if self.closed or self._tokens >= self._want:
            self._ready.set()
        return True

    async def get(self, min_tokens: int = 0) -> StreamItem:
        """Everything buffered so far, as one batch, once it holds at least `min_tokens`
        tokens (or its finish); a StreamError comes alone, last.

        Raises ClientTooSlow once the buffer overflowed."""
        want = max(1, min_tokens)
        while not self._taken(want):
            if self.overflowed:
                raise ClientTooSlow("client fell too far behind the engine")
            self._want = want
            self._ready.clear()
            try:
                await self._ready.wait()
            finally:
                self._want = 0
        if not self._pushes:
            assert self._end is not None
            end, self._end = self._end, None
            return end
        self._close_run()
        events, self._events = self._events, []
        self._tokens = self._pushes = self._count = 0
        return events

    def _close_run(self) -> None:
        """The buffered run of plain token events as one event (in order; the prefix-cache
        hit is the run's largest)."""
        run = self._run
        if len(run) == 1:
            self._events.append(run[0])
        elif run:
            tokens = tuple(t for e in run for t in e.token_ids)
            cached = max(e.cached_tokens for e in run)
            self._events.append(TokensEvent(run[0].request_id, tokens, cached_tokens=cached))
        run.clear()

    def _taken(self, want: int) -> bool:
        """Whether `get` returns now: an end, or events with `want` tokens (any events for
        a first batch, `want` 1, which may hold no token yet)."""
        if self._end is not None or (self.closed and self._pushes):
            return True
        if want <= 1:
            return self._pushes > 0
        return self._tokens >= want
