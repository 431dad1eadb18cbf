"""The engine actor: the event-loop side of an `EngineLoop` that runs on a thread.

Request handlers (HTTP routes, or any asyncio code) never touch the engine. They `reserve()` an
intake slot (before tokenizing, so an overloaded frontend refuses cheaply with `QueueFull`),
then `submit()` a typed message; the actor's thread runs `engine_loop.EngineLoop`, the same
loop an engine process runs (admission, grammar-compile wait, stepping, shutdown), with a
queue as its transport (`_Channel`). After each turn the thread hands every touched request
its events in one `call_soon_threadsafe` callback; `RequestStream` is where they coalesce.

Invariants:
- a reservation is released exactly once: when the request enters the engine, or unused;
- every submitted stream gets a final item (FinishedEvent or StreamError);
- if `engine.step()` raises, the actor is dead: every open stream gets a StreamError, new
  reservations raise `EngineUnavailable`, and `on_death` is called on the event loop.
Several actors (data-parallel replicas, `replicas.py`) can share one `IntakeSlots`.
"""

from __future__ import annotations

import asyncio
import contextlib
import queue
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from resin.events import Event
from resin.frontend.engine_loop import (
    DEFAULT_MAX_ACTIVE,
    EngineLoop,
    LoopPolicy,
    RefusalKind,
    Waiting,
)
from resin.frontend.errors import EngineUnavailable
from resin.frontend.intake_slots import IntakeSlots, Reservation, SlotsFront
from resin.frontend.ports import ConstraintCompiler, EngineLike
from resin.frontend.stream import RequestStream, StreamError, StreamItem
from resin.params import SamplingParams
from resin.plan import MediaItem

IDLE_WAIT_S = 0.5
"""How long the idle thread blocks on its queue (any message wakes it at once)."""

CUT_OFF = "server is shutting down; the answer was cut off"


@dataclass(frozen=True, slots=True)
class _Abort:
    stream: RequestStream


@dataclass(frozen=True, slots=True)
class _Stop:
    pass


_Message = Waiting[RequestStream] | _Abort | _Stop


class _Channel:
    """The `Transport` of an in-process `EngineLoop`: a queue in, loop callbacks out."""

    def __init__(self, deliver: Callable[[list[tuple[RequestStream, StreamItem]]], None]) -> None:
        self.intake: queue.SimpleQueue[_Message] = queue.SimpleQueue()
        self.lock = threading.Lock()
        self.error: str | None = None
        self.stopped = False
        self.event_loop: asyncio.AbstractEventLoop | None = None
        self.on_death: Callable[[], None] | None = None
        self._deliver = deliver
        self._outbox: list[tuple[RequestStream, StreamItem]] = []
        """Items of the current turn (the actor thread's own)."""
        self._handoff: list[tuple[RequestStream, StreamItem]] = []
        self._handoff_lock = threading.Lock()
        self._scheduled = False

    def send(self, item: Waiting[RequestStream]) -> str | None:
        """Queue a submit (event loop); the error when the loop no longer takes any."""
        with self.lock:  # a submit after `died` or `closing` fails at once (no hang)
            if self.error is None and not self.stopped:
                self.intake.put(item)
                return None
            return self.error or "server is shutting down"

    # ---- Transport (the actor thread) --------------------------------------------------
    def poll(self, loop: EngineLoop[RequestStream], timeout_s: float | None) -> None:
        try:
            wait = IDLE_WAIT_S if timeout_s is None else timeout_s
            msg = self.intake.get(timeout=wait) if wait > 0 else self.intake.get_nowait()
            while True:
                if isinstance(msg, _Stop):
                    loop.request_stop()
                elif isinstance(msg, _Abort):
                    loop.abort(msg.stream)
                else:
                    loop.submit(msg)
                msg = self.intake.get_nowait()
        except queue.Empty:
            return

    def cancelled(self, item: Waiting[RequestStream]) -> bool:
        return item.key.cancelled

    def entered(self, item: Waiting[RequestStream], request_id: int) -> None:
        item.origin.release()
        item.key.request_id = request_id

    def deliver(self, item: Waiting[RequestStream], events: list[Event]) -> None:
        self._outbox.append((item.key, events))

    def refuse(self, item: Waiting[RequestStream], message: str, kind: RefusalKind) -> None:
        item.origin.release()
        self._outbox.append((item.key, StreamError(message, kind)))

    def cut_off(self, item: Waiting[RequestStream]) -> None:
        item.key.abort_reason = CUT_OFF

    def flush(self, loop: EngineLoop[RequestStream]) -> None:
        self._send_out()

    def _send_out(self) -> None:
        """One pending event-loop callback at most: a busy event loop gets several turns'
        items in one delivery instead of a backlog."""
        if not self._outbox:
            return
        batch, self._outbox = self._outbox, []
        event_loop = self.event_loop
        if event_loop is None or event_loop.is_closed():
            return
        with self._handoff_lock:
            self._handoff.extend(batch)
            if self._scheduled:
                return
            self._scheduled = True
        with contextlib.suppress(RuntimeError):  # the loop closed after the check
            event_loop.call_soon_threadsafe(self._hand_over)

    def _hand_over(self) -> None:
        with self._handoff_lock:
            batch, self._handoff = self._handoff, []
            self._scheduled = False
        self._deliver(batch)

    def closing(self) -> bool:
        with self.lock:
            self.stopped = self.intake.empty()
            return self.stopped

    def died(self, message: str) -> None:
        with self.lock:
            self.error = message
        with contextlib.suppress(queue.Empty):  # submits that raced the error fail too
            while True:
                if isinstance(msg := self.intake.get_nowait(), Waiting):
                    self.refuse(msg, message, "unavailable")
        self._send_out()
        if self.on_death is not None and self.event_loop is not None:
            with contextlib.suppress(RuntimeError):
                self.event_loop.call_soon_threadsafe(self.on_death)


class EngineActor(SlotsFront):
    """Owns the engine thread; the public methods are safe to call from the event loop."""

    def __init__(
        self,
        engine: EngineLike,
        *,
        queue_capacity: int = 1024,
        max_active: int = DEFAULT_MAX_ACTIVE,
        admissions_per_step: int = 4,
        stream_capacity: int = 64,
        on_death: Callable[[], None] | None = None,
        slots: IntakeSlots | None = None,
    ) -> None:
        self.engine = engine
        self.slots = slots or IntakeSlots(queue_capacity)
        """The intake queue (shared with the other replicas' actors, if any)."""
        self.max_active = max_active
        self.admissions_per_step = admissions_per_step
        self.stream_capacity = stream_capacity
        self._channel = _Channel(self._deliver)
        self._channel.on_death = on_death
        policy = LoopPolicy(max_active, admissions_per_step, self.slots.capacity)
        self._loop: EngineLoop[RequestStream] = EngineLoop(engine, self._channel, policy)
        self._open: set[RequestStream] = set()
        self._thread: threading.Thread | None = None
        self._deliveries = 0

    @property
    def on_death(self) -> Callable[[], None] | None:
        return self._channel.on_death

    @on_death.setter
    def on_death(self, callback: Callable[[], None] | None) -> None:
        self._channel.on_death = callback

    @property
    def error(self) -> str | None:
        """Why the engine died (None while it serves)."""
        return self._channel.error

    # ---- event-loop side -------------------------------------------------------------
    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        self._channel.event_loop = loop
        self._thread = threading.Thread(target=self._loop.run, name="resin-engine", daemon=True)
        self._thread.start()

    @property
    def has_grammar(self) -> bool:
        """Whether the engine can enforce constraints (it has a grammar backend)."""
        return getattr(self.engine, "grammar", None) is not None

    @property
    def compiler(self) -> ConstraintCompiler | None:
        """The engine's grammar backend when it compiles off the engine thread."""
        backend = getattr(self.engine, "grammar", None)
        return backend if callable(getattr(backend, "prepare", None)) else None

    @property
    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive() and self.error is None

    def stalled_for(self) -> float:
        """Seconds the engine has made no progress while work is queued or running (0 while
        idle or stepping along): a stopped engine process, or a step that never returns."""
        since = self._loop.busy_since
        if since is None:
            return 0.0
        heard = getattr(self.engine, "heard_at", None)  # an engine process's last report
        if isinstance(heard, float):
            since = max(since, heard)
        return max(0.0, time.monotonic() - since)

    def abandon(self, reason: str = "server is shutting down; the answer was cut off") -> None:
        """Shutdown with an engine that does not answer (event-loop side): every open stream
        ends now with `reason` (its client gets the shutdown event), and the actor thread ends
        without waiting for the engine's final events."""
        self._loop.abandon()
        self.slots.accepting = False
        self._channel.intake.put(_Stop())
        for stream in list(self._open):
            stream.push(StreamError(reason))
        self._open.clear()

    @property
    def load(self) -> int:
        """Requests submitted here whose streams are still open (event-loop side)."""
        return len(self._open)

    @property
    def replicas(self) -> list[EngineActor]:
        """The actors behind this front: just this one (`ReplicaSet` has several)."""
        return [self]

    def route(
        self, prompt: Sequence[int], media: Sequence[MediaItem] = (), replica: int | None = None
    ) -> EngineActor:
        """The actor a prompt goes to: this one (`ReplicaSet.route` chooses among several)."""
        return self

    def reserve(self) -> Reservation:
        """Take one intake slot or raise QueueFull / EngineUnavailable (never blocks)."""
        return self.reserve_many(1)[0]

    def reserve_many(
        self, count: int, owner: object = None, owner_limit: int | None = None
    ) -> list[Reservation]:
        """`IntakeSlots.reserve_many`; EngineUnavailable once the engine died too."""
        if self.error is not None:
            raise EngineUnavailable(f"engine unavailable: {self.error}")
        return self.slots.reserve_many(count, owner, owner_limit)

    def submit(
        self,
        reservation: Reservation,
        prompt: tuple[int, ...],
        params: SamplingParams,
        media: tuple[MediaItem, ...] = (),
    ) -> RequestStream:
        stream = RequestStream(self.stream_capacity)
        item = Waiting(stream, prompt, params, media, origin=reservation)
        error = self._channel.send(item)
        if error is not None:
            reservation.release()
            stream.push(StreamError(error))
        else:
            self._open.add(stream)
        return stream

    def abort(self, stream: RequestStream) -> None:
        """Cancel a request (client gone or too slow); its engine pages are freed."""
        stream.cancelled = True
        if not stream.closed or stream.overflowed:
            self._channel.intake.put(_Abort(stream))

    def request_stop(self) -> None:
        """Refuse new reservations (503) from now on; tell the actor to abort open requests
        and end (non-blocking)."""
        self.slots.accepting = False
        self._channel.intake.put(_Stop())

    def stop(self, timeout: float = 10.0) -> None:
        """`request_stop()`, then wait for the actor thread to end."""
        self.request_stop()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout)

    def _deliver(self, batch: list[tuple[RequestStream, StreamItem]]) -> None:
        """Hand each stream its items (event loop); a stream whose reader fell behind is
        aborted."""
        self._deliveries += 1
        for stream, item in batch:
            if not stream.push(item, self._deliveries):
                self._channel.intake.put(_Abort(stream))
            if stream.closed:  # its last item (or an overflow): no longer this actor's load
                self._open.discard(stream)
