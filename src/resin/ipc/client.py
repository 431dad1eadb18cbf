"""`EngineClient`: an engine in another process, as the `EngineLike` a frontend's actor drives.

`submit` and `abort` send a message and return at once (the request id is the client's own,
unique per engine: the frontend's index in the top bits); `step` waits a moment for the
engine's next outputs and returns them as the engine's own events, plus a `Refusal` for each
request the engine did not take. The engine process does the admission, so the frontend's
actor over a client only forwards (`resin_app.serve_split` gives it no limits of its own).

What the frontend reads from other threads: `num_waiting`, `num_running` and `metrics` are
the engine's last report (sent with every output and at least every status interval while it
works, read whenever the actor looks for work); `cached_prefix` is a local record of the
prompts this client sent (page-aligned block hashes, least recently used dropped), the
routing hint data-parallel replicas use: a prompt whose prefix this replica saw is routed
back to it. Prompts with media are not recorded.

`step` waits at most `poll_ms` (20) for outputs: a new submit reaches the engine within that
while others run (outputs end the wait at once). A much shorter wait wakes the frontend
hundreds of times a second, which on a small host takes cores from the engine process's
torch threads (a 2 ms wait made the reference runner's steps 6x slower on 2 cores).

When the engine process ends (its socket disconnects), `has_work()` turns True and `step()`
raises, so the actor fails the open requests (503s, error events) and stops.
"""

from __future__ import annotations

import pickle
import threading
import time
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, cast

import zmq
from zmq.utils.monitor import recv_monitor_message

from resin.errors import EngineDeadError
from resin.events import Event, FinishedEvent
from resin.frontend.ports import Refusal
from resin.ipc import wire
from resin.metrics.collector import MetricsSnapshot
from resin.params import SamplingParams
from resin.plan import MediaItem

ID_BITS = 40
"""A frontend's request ids are `frontend << ID_BITS | n`: unique across the frontends of
one engine."""

MAX_PREFIX_BLOCKS = 1 << 16


@dataclass(frozen=True, slots=True)
class Handle:
    """What `submit` returns: the request's id (`RequestHandle`)."""

    id: int


@dataclass(frozen=True, slots=True)
class RemoteGrammar:
    """Stands for the engine process's grammar backend: constraints are compiled there, so
    this has no `prepare` (the actor sends constrained requests straight on)."""

    compile_timeout_s: float


class EngineClient:
    """Talks to the `EngineService` at `address` (an `ipc://` endpoint it binds)."""

    def __init__(
        self,
        address: str,
        frontend: int = 0,
        *,
        ready_timeout_s: float = 600.0,
        poll_ms: int = 20,
        context: zmq.Context[Any] | None = None,
    ) -> None:
        self.address = address
        self.frontend = frontend
        self.poll_ms = poll_ms
        self._context = context or zmq.Context.instance()
        self._socket: zmq.Socket[bytes] = self._context.socket(zmq.PAIR)
        self._socket.setsockopt(zmq.LINGER, 0)
        self._monitor = self._socket.get_monitor_socket(zmq.EVENT_DISCONNECTED)
        self._socket.connect(address)
        self._socket.send(wire.encode(wire.Hello(frontend)))
        self.info = self._wait_ready(ready_timeout_s)
        self.grammar = RemoteGrammar(self.info.compile_timeout_s) if self.info.has_grammar else None
        self._metrics: MetricsSnapshot | bytes | None = self.info.metrics
        self.num_waiting = 0
        self.num_running = 0
        self.heard_at = time.monotonic()
        """When the engine process last sent anything (outputs or its status report, which
        comes every status interval while it steps): the frontend's stall clock, so requests
        queued behind other frontends' work do not count as a stall."""
        self.dead = False
        self._gone: str | None = None
        self._next = 0
        self._inflight: set[int] = set()
        self._lock = threading.Lock()
        self._seen: OrderedDict[int, None] = OrderedDict()

    def _wait_ready(self, timeout_s: float) -> wire.Ready:
        if not self._socket.poll(int(timeout_s * 1000)):
            raise TimeoutError(f"engine at {self.address} did not answer in {timeout_s:g} s")
        msg = wire.decode(self._socket.recv())
        if not isinstance(msg, wire.Ready):
            raise RuntimeError(f"engine at {self.address} answered {type(msg).__name__}")
        return msg

    @property
    def context_length(self) -> int:
        return self.info.context_length

    @property
    def pid(self) -> int:
        """The engine process's id."""
        return self.info.pid

    # ---- EngineLike (the actor thread) -------------------------------------------------
    def submit(
        self,
        prompt_token_ids: Sequence[int],
        sampling_params: SamplingParams | None = None,
        *,
        media: Sequence[MediaItem] = (),
        request_id: int | None = None,
    ) -> Handle:
        if self._disconnected():
            raise EngineDeadError(self._gone or "the engine process ended")
        params = SamplingParams() if sampling_params is None else sampling_params
        if request_id is None:
            request_id = (self.frontend << ID_BITS) | self._next
            self._next += 1
        message = wire.submit_message(request_id, prompt_token_ids, params, media)
        self._socket.send(wire.encode(message), copy=False)
        self._inflight.add(request_id)
        if not media:
            self._remember(prompt_token_ids)
        return Handle(request_id)

    def abort(self, request: Any) -> None:
        rid = int(getattr(request, "id", request))
        if rid in self._inflight and not self._disconnected():
            self._socket.send(wire.encode(wire.Abort(rid)))

    def has_work(self) -> bool:
        """Requests in flight, a report waiting to be read, or the engine process ended."""
        return bool(self._inflight) or bool(self._socket.poll(0)) or self._disconnected()

    def step(self) -> list[Event | Refusal]:
        """The engine's outputs since the last call (waits up to `poll_ms` for some)."""
        if self._disconnected():
            raise RuntimeError(self._gone)
        events: list[Event | Refusal] = []
        if not self._socket.poll(self.poll_ms):
            return events
        messages: list[wire.Outputs] = []
        while True:
            try:
                data = self._socket.recv(zmq.NOBLOCK, copy=False)
            except zmq.Again:
                break
            msg = wire.decode(cast(memoryview, data.buffer))
            if isinstance(msg, wire.Outputs):
                messages.append(msg)
        if messages:
            self._read(messages, events)
        return events

    def _read(self, messages: list[wire.Outputs], events: list[Event | Refusal]) -> None:
        """Every message that waited, read as one (`wire.unpack_many`): a frontend behind the
        engine gets each request's tokens of several steps in one event."""
        self.heard_at = time.monotonic()
        last = messages[-1]
        self.num_waiting, self.num_running = last.waiting, last.running
        snapshot = next((m.metrics for m in reversed(messages) if m.metrics), b"")
        if snapshot:
            self._metrics = snapshot
        for event in wire.unpack_many(messages):
            if isinstance(event, FinishedEvent):
                self._inflight.discard(event.request_id)
            events.append(event)
        for msg in messages:
            for rid, message, kind in msg.refused:
                self._inflight.discard(rid)
                events.append(Refusal(rid, message, cast(Any, kind)))

    @property
    def metrics(self) -> MetricsSnapshot | None:
        """The engine's last metrics snapshot (unpickled when read: reports come ten times a
        second, readers every few seconds)."""
        if isinstance(self._metrics, bytes):
            self._metrics = pickle.loads(self._metrics) if self._metrics else None
        return self._metrics

    def close(self) -> None:
        self._monitor.close(0)
        self._socket.close(0)

    # ---- the engine process's end ------------------------------------------------------
    def _disconnected(self) -> bool:
        if self._gone is None and self._monitor.poll(0):
            event = recv_monitor_message(self._monitor)
            if event["event"] == zmq.EVENT_DISCONNECTED:
                self._gone = f"the engine process (pid {self.pid}) ended"
                self.dead = True
        return self._gone is not None

    # ---- routing hint ------------------------------------------------------------------
    def cached_prefix(self, prompt: Sequence[int], media: Sequence[MediaItem] = ()) -> int:
        """Prompt tokens this client sent before as the start of a prompt (page-aligned)."""
        if media:
            return 0
        page = self.info.page_size
        with self._lock:
            hit = 0
            for block in _blocks(prompt, page):
                if block not in self._seen:
                    break
                hit += page
        return hit

    def _remember(self, prompt: Sequence[int]) -> None:
        with self._lock:
            for block in _blocks(prompt, self.info.page_size):
                self._seen[block] = None
                self._seen.move_to_end(block)
            while len(self._seen) > MAX_PREFIX_BLOCKS:
                self._seen.popitem(last=False)


def _blocks(prompt: Sequence[int], page: int) -> list[int]:
    """A chained hash per full page of `prompt` (block i's hash covers pages 0..i)."""
    tokens = list(prompt)
    out: list[int] = []
    h = 0
    for start in range(0, len(tokens) - page + 1, page):
        h = hash((h, *tokens[start : start + page]))
        out.append(h)
    return out
