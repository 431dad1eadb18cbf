"""The engine actor: the one thread that drives the engine.

Request handlers (HTTP routes, or any asyncio code) never touch the engine. They `reserve()` an
intake slot (before tokenizing, so an overloaded frontend refuses cheaply with `QueueFull`),
then `submit()` a typed message; the actor admits at most `admissions_per_step` requests per
engine step and keeps at most `max_active` requests inside the engine. After each step it
hands every touched request its events in one `call_soon_threadsafe` batch.

A constrained request waits in the intake while its grammar compiles off the engine thread
(`compiling.py`), so one costly grammar never stops the other requests' steps. Invariants:
- a reservation is released exactly once: when the request enters the engine, or unused;
- every submitted stream gets a final item (FinishedEvent or StreamError);
- if `engine.step()` raises, the actor is dead: every open stream gets a StreamError, new
  reservations raise `EngineUnavailable`, and `on_death` is called on the event loop.
Several actors (data-parallel replicas, `replicas.py`) can share one `IntakeSlots`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import queue
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

from resin.events import Event, FinishedEvent, TokensEvent
from resin.frontend.admission import Admission, Entry
from resin.frontend.compiling import Compiling
from resin.frontend.errors import EngineUnavailable
from resin.frontend.intake_slots import IntakeSlots, Reservation, SlotsFront
from resin.frontend.ports import ConstraintCompiler, EngineLike, Refusal
from resin.frontend.stream import RequestStream, StreamError, StreamItem
from resin.params import SamplingParams
from resin.plan import MediaItem

log = logging.getLogger("resin.frontend")


@dataclass(frozen=True, slots=True)
class _Submit:
    stream: RequestStream
    prompt: tuple[int, ...]
    params: SamplingParams
    reservation: Reservation
    media: tuple[MediaItem, ...] = ()
    grammar: object = None  # the constraint's state, compiled off the engine thread


@dataclass(frozen=True, slots=True)
class _Abort:
    stream: RequestStream


@dataclass(frozen=True, slots=True)
class _Stop:
    pass


_Message = _Submit | _Abort | _Stop


class EngineActor(SlotsFront):
    """Owns the engine thread; the public methods are safe to call from the event loop."""

    def __init__(
        self,
        engine: EngineLike,
        *,
        queue_capacity: int = 1024,
        max_active: int = 128,
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
        self.on_death = on_death
        self.error: str | None = None
        self._intake: queue.SimpleQueue[_Message] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._open: set[RequestStream] = set()
        self._admission: Admission[_Submit] = Admission()
        self._pending = self._admission.waiting
        self._compiling: Compiling[_Submit] = Compiling(self._enter, self._reject)
        self._active: dict[int, RequestStream] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._outbox: list[tuple[RequestStream, StreamItem]] = []
        self._outbox_lock = threading.Lock()
        self._delivery_scheduled = False
        self._thread: threading.Thread | None = None
        self._stopped = False
        self._abandoned = False
        self._busy_since: float | None = None
        """While work is queued or running: when the engine last made progress (a step that
        returned events, or work arriving); None while idle. Written by the actor thread."""

    # ---- event-loop side -------------------------------------------------------------
    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._thread = threading.Thread(target=self._run, name="resin-engine", daemon=True)
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
        since = self._busy_since
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
        self._abandoned = True
        self.slots.accepting = False
        self._intake.put(_Stop())
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
        sub = _Submit(stream, prompt, params, reservation, media)
        compiler = self.compiler if params.constraint is not None else None
        with self._lock:  # a submit after `_die` drained the intake fails at once (no hang)
            error = self.error
            if error is None:
                self._open.add(stream)
                if compiler is None:
                    self._intake.put(sub)
        if error is not None:
            reservation.release()
            stream.push(StreamError(error))
        elif compiler is not None and params.constraint is not None:
            self._compiling.start(stream, sub, params.constraint, compiler, self._loop)
        return stream

    def _enter(self, sub: _Submit, grammar: object) -> None:  # its grammar compiled
        with self._lock:
            if self.error is None and not self._stopped:
                self._intake.put(replace(sub, grammar=grammar))
                return
        self._reject(sub, StreamError(self.error or "server is shutting down"))

    def abort(self, stream: RequestStream) -> None:
        """Cancel a request (client gone or too slow); its engine pages are freed."""
        stream.cancelled = True
        if (sub := self._compiling.claim(stream)) is not None:  # its grammar is compiling
            self._reject(sub, StreamError("aborted", "aborted"))
        elif not stream.closed or stream.overflowed:
            self._intake.put(_Abort(stream))

    def request_stop(self) -> None:
        """Refuse new reservations (503) from now on; tell the actor to abort open requests
        and end (non-blocking)."""
        self.slots.accepting = False
        self._intake.put(_Stop())

    def stop(self, timeout: float = 10.0) -> None:
        """`request_stop()`, then wait for the actor thread to end."""
        self.request_stop()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout)

    # ---- actor thread ----------------------------------------------------------------
    def _run(self) -> None:
        stopping = False
        while True:
            try:
                idle = not self._pending and not self.engine.has_work()
                if idle:
                    self._busy_since = None
                elif self._busy_since is None:
                    self._busy_since = time.monotonic()
                if (stopping and idle and self._close()) or self._abandoned:
                    return
                stopping = self._drain(block=idle) or stopping
                if stopping:
                    self._abort_all()
                self._admit()
                if self.engine.has_work():
                    events = self.engine.step()
                    if events:
                        self._busy_since = time.monotonic()
                    self._dispatch(events)
                    if getattr(self.engine, "dead", False) and not stopping:
                        self._die("the engine stopped (runner failure)")
                        return
            except Exception as exc:
                log.exception("engine actor failed")
                self._die(f"engine failed: {exc}")
                return

    def _close(self) -> bool:  # refuse compiled submits from now on, unless one just came
        with self._lock:
            self._stopped = self._intake.empty()
            return self._stopped

    def _drain(self, block: bool) -> bool:
        """Move intake messages into actor state; True when a stop was requested."""
        stop = False
        try:
            msg = self._intake.get(timeout=0.5) if block else self._intake.get_nowait()
            while True:
                stop = self._handle(msg) or stop
                msg = self._intake.get_nowait()
        except queue.Empty:
            return stop

    def _handle(self, msg: _Message) -> bool:
        if isinstance(msg, _Stop):
            return True
        if isinstance(msg, _Submit):
            self._pending.append(msg)
        elif msg.stream.request_id is not None and msg.stream.request_id in self._active:
            self.engine.abort(msg.stream.request_id)
        else:
            for sub in list(self._pending):
                if sub.stream is msg.stream:
                    self._pending.remove(sub)
                    self._reject(sub, StreamError("aborted", "aborted"))
        return False

    def _admit(self) -> None:
        """`Admission`'s rule; a request whose client left while it queued is dropped."""
        outcomes = self._admission.admit(
            self.engine,
            len(self._active),
            (self.max_active, self.admissions_per_step),
            lambda sub: Entry(sub.prompt, sub.params, sub.media, sub.grammar),
            lambda sub: sub.stream.cancelled,
        )
        for outcome in outcomes:
            sub = outcome.item
            if outcome.kind == "entered":
                assert outcome.request_id is not None
                sub.reservation.release()
                sub.stream.request_id = outcome.request_id
                self._active[outcome.request_id] = sub.stream
            elif outcome.kind == "dead":
                self._pending.appendleft(sub)
                raise RuntimeError(outcome.message)
            elif outcome.kind == "dropped":
                self._reject(sub, StreamError("aborted", "aborted"))
            else:
                self._reject(sub, StreamError(outcome.message, "refused"))

    def _reject(self, sub: _Submit, error: StreamError) -> None:
        sub.reservation.release()
        self._post([(sub.stream, error)])

    def _dispatch(self, events: Sequence[Event | Refusal]) -> None:
        batches: dict[int, list[Event]] = {}
        out: list[tuple[RequestStream, StreamItem]] = []
        for event in events:
            if isinstance(event, Refusal):
                if (stream := self._active.pop(event.request_id, None)) is not None:
                    out.append((stream, StreamError(event.message, event.kind)))
            elif isinstance(event, TokensEvent | FinishedEvent):
                batches.setdefault(event.request_id, []).append(event)
            else:
                log.warning("engine error event: %s", event.message)
        for rid, batch in batches.items():
            stream = self._active.get(rid)
            if stream is None:
                continue
            if isinstance(batch[-1], FinishedEvent):
                del self._active[rid]
            out.append((stream, batch))
        if out:
            self._post(out)

    def _abort_all(self) -> None:
        for sub in self._compiling.take_all():
            self._reject(sub, StreamError("server is shutting down"))
        while self._pending:
            self._reject(self._pending.popleft(), StreamError("server is shutting down"))
        for rid, stream in list(self._active.items()):
            stream.abort_reason = "server is shutting down; the answer was cut off"
            self.engine.abort(rid)

    def _die(self, message: str) -> None:
        with self._lock:
            self.error = message
            compiling = self._compiling.take_all()
        self._pending.extend(compiling)
        with contextlib.suppress(queue.Empty):  # submits that raced the error fail below too
            while True:
                if isinstance(msg := self._intake.get_nowait(), _Submit):
                    self._pending.append(msg)
        streams = [s.stream for s in self._pending] + list(self._active.values())
        for sub in self._pending:
            sub.reservation.release()
        self._pending.clear()
        self._active.clear()
        self._post([(s, StreamError(message)) for s in streams])
        if self.on_death is not None and self._loop is not None:
            self._loop.call_soon_threadsafe(self.on_death)

    def _post(self, batch: list[tuple[RequestStream, StreamItem]]) -> None:
        """Queue items for the loop; one pending loop callback at most (coalescing), so a
        busy loop gets several steps' events in one delivery instead of a backlog."""
        if self._loop is None or self._loop.is_closed():
            return
        with self._outbox_lock:
            self._outbox.extend(batch)
            if self._delivery_scheduled:
                return
            self._delivery_scheduled = True
        with contextlib.suppress(RuntimeError):  # the loop closed after the check
            self._loop.call_soon_threadsafe(self._deliver)

    def _deliver(self) -> None:
        with self._outbox_lock:
            batch, self._outbox = self._outbox, []
            self._delivery_scheduled = False
        per_stream: dict[RequestStream, list[StreamItem]] = {}
        for stream, item in batch:
            items = per_stream.setdefault(stream, [])
            if items and isinstance(item, list) and isinstance(items[-1], list):
                items[-1] = items[-1] + item  # one push per stream per delivery
            else:
                items.append(item)
        for stream, items in per_stream.items():
            for item in items:
                if not stream.push(item):
                    self._intake.put(_Abort(stream))
            if stream.closed:  # its last item (or an overflow): no longer this actor's load
                self._open.discard(stream)
