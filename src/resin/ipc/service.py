"""`EngineService`: the loop of an engine process, around one `Engine`.

It steps whenever the engine has work and never waits on a frontend: messages are read
without blocking between steps (the loop blocks only while idle), outputs are sent without
blocking. The admission policy lives here, so it holds however many frontends submit: at most
`admissions_per_step` requests enter the engine per step and at most `max_active` are inside
it; the rest wait in arrival order (`queue_capacity` in all, then `busy`). A constrained
request compiles on the grammar backend's threads (`prepare`) while the engine steps, then
enters, or is refused (`refused`: the spec fails; `busy`: too many compiles queued; also after
`compile_timeout_s`).

Invariants:
- every request a frontend submitted gets exactly one end: a `FinishedEvent` (also for one
  aborted before it entered the engine) or a refusal;
- a frontend whose socket disconnects (its process ended) has all its requests aborted; their
  pages are freed within one step;
- `request_stop()` (SIGTERM) aborts everything, sends the final events and ends `run()`; a
  dead runner ends `run()` after its error events went out (`dead` is True then).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

import zmq
from zmq.utils.monitor import recv_monitor_message

from resin.errors import GrammarBusy
from resin.events import Event, FinishedEvent, FinishReason, TokensEvent
from resin.frontend.admission import Admission, Entry
from resin.ipc import wire
from resin.params import SamplingParams
from resin.plan import MediaItem

log = logging.getLogger("resin.ipc")

WAIT_ON_DEVICE_S = 0.001
"""The poll's wait after a step that returned no events (the device is still busy)."""

SEND_HWM = 100_000
"""Messages queued for one frontend before it counts as gone (it stopped reading)."""


@dataclass(frozen=True, slots=True)
class ServicePolicy:
    """The engine side's admission policy and status cadence."""

    max_active: int = 128
    admissions_per_step: int = 4
    queue_capacity: int = 1024
    status_interval_s: float = 0.1


@dataclass(slots=True)
class _Waiting:
    rid: int
    frontend: int
    prompt: list[int]
    params: SamplingParams
    media: tuple[MediaItem, ...]
    grammar: Any = None
    future: Future[Any] | None = None
    deadline: float = 0.0


@dataclass(slots=True)
class _Frontend:
    socket: zmq.Socket[bytes]
    monitor: zmq.Socket[bytes]
    alive: bool = False
    """From its `Hello` until its socket disconnects."""
    outbox: list[Event] = field(default_factory=list)
    refused: list[tuple[int, str, str]] = field(default_factory=list)


class EngineService:
    """Serves one engine to the frontends at `addresses` (`ipc://` endpoints it binds)."""

    def __init__(
        self,
        engine: Any,
        addresses: Sequence[str],
        policy: ServicePolicy | None = None,
        context: zmq.Context[Any] | None = None,
    ) -> None:
        self.engine = engine
        self.policy = policy or ServicePolicy()
        self._context = context or zmq.Context()
        self._fronts = [self._bind(address) for address in addresses]
        self._poller = zmq.Poller()
        for front in self._fronts:
            self._poller.register(front.socket, zmq.POLLIN)
            self._poller.register(front.monitor, zmq.POLLIN)
        self._admission: Admission[_Waiting] = Admission()
        self._pending = self._admission.waiting
        self._compiling: dict[int, _Waiting] = {}
        self._owner: dict[int, int] = {}  # rid -> frontend, from submit to its end
        self._inside: set[int] = set()  # rids inside the engine
        self._stopping = False
        self._stopped_intake = False
        self._next_status = 0.0
        self._dirty = True  # something changed since the last status went out
        self._wait = 0.0  # how long to poll while the engine has work
        self._grammar: Any = getattr(engine, "grammar", None)

    def _bind(self, address: str) -> _Frontend:
        sock: zmq.Socket[bytes] = self._context.socket(zmq.PAIR)
        sock.setsockopt(zmq.SNDHWM, SEND_HWM)
        sock.setsockopt(zmq.LINGER, 0)
        sock.bind(address)
        monitor = sock.get_monitor_socket(zmq.EVENT_DISCONNECTED)
        return _Frontend(sock, monitor)

    # ---- public ------------------------------------------------------------------------
    def ready(self) -> wire.Ready:
        import os

        config = self.engine.runner_config
        return wire.Ready(
            pid=os.getpid(),
            context_length=int(self.engine.context_length),
            vocab_size=int(config.vocab_size),
            page_size=int(self.engine.layout.page_size),
            has_grammar=self._grammar is not None,
            compile_timeout_s=float(getattr(self._grammar, "compile_timeout_s", 10.0)),
            metrics=_metrics(self.engine),
        )

    def request_stop(self) -> None:
        """Abort everything and end `run()` once the final events are out (signal-safe)."""
        self._stopping = True

    @property
    def dead(self) -> bool:
        return bool(getattr(self.engine, "dead", False))

    def run(self) -> None:
        """Step until `request_stop()`, or until the runner died."""
        while True:
            if self._stopping and not self._stopped_intake:
                self._abort_everything()
            busy = self.engine.has_work() or bool(self._pending)
            if self._stopping and not busy and not self._compiling:
                self._flush()
                return
            idle = self.policy.status_interval_s if self._dirty else 0.25
            self._poll(self._wait if busy else 0.005 if self._compiling else idle)
            self._check_compiles()
            self._admit()
            if self.engine.has_work():
                self._dirty = True
                events = self.engine.step()
                # A step that returned nothing waits on the device (an overlapped runner's
                # thread): block in the poll a moment instead of spinning, so that thread
                # gets the GIL (a spinning loop makes every one of its ops wait).
                self._wait = 0.0 if events else WAIT_ON_DEVICE_S
                self._route(events)
                if self.dead:
                    self._flush()
                    return
            self._flush()

    def close(self) -> None:
        for front in self._fronts:
            front.monitor.close(0)
            front.socket.close(0)

    # ---- messages in -------------------------------------------------------------------
    def _poll(self, timeout_s: float) -> None:
        ready = dict(self._poller.poll(int(timeout_s * 1000)))
        self._dirty = self._dirty or bool(ready)
        for index, front in enumerate(self._fronts):
            if front.monitor in ready:
                self._monitor(index, front)
            if front.socket in ready:
                self._receive(index, front)

    def _monitor(self, index: int, front: _Frontend) -> None:
        while front.monitor.poll(0):
            event = recv_monitor_message(front.monitor)
            if event["event"] == zmq.EVENT_DISCONNECTED and front.alive:
                owned = sum(1 for owner in self._owner.values() if owner == index)
                if owned:
                    log.warning("frontend %d went away; aborting its %d requests", index, owned)
                self._frontend_gone(index)

    def _receive(self, index: int, front: _Frontend) -> None:
        while True:
            try:
                data = front.socket.recv(zmq.NOBLOCK, copy=True)
            except zmq.Again:
                return
            self._handle(index, front, wire.decode(data))

    def _handle(self, index: int, front: _Frontend, msg: wire.Message) -> None:
        if isinstance(msg, wire.Hello):
            front.alive = True
            self._send(front, self.ready())
        elif isinstance(msg, wire.Submit):
            self._submitted(index, front, msg)
        elif isinstance(msg, wire.Abort):
            self._abort(msg.rid)

    def _submitted(self, index: int, front: _Frontend, msg: wire.Submit) -> None:
        if self._stopping:
            front.refused.append((msg.rid, "server is shutting down", "unavailable"))
            return
        if len(self._pending) + len(self._compiling) >= self.policy.queue_capacity:
            front.refused.append((msg.rid, "engine busy: its queue is full", "busy"))
            return
        try:
            prompt, params, media = wire.read_submit(msg)
        except (ValueError, TypeError) as exc:
            front.refused.append((msg.rid, str(exc), "refused"))
            return
        item = _Waiting(msg.rid, index, prompt, params, media)
        self._owner[msg.rid] = index
        prepare = getattr(self._grammar, "prepare", None)
        if params.constraint is not None and prepare is not None:
            item.future = prepare(params.constraint)
            item.deadline = time.monotonic() + float(self._grammar.compile_timeout_s)
            self._compiling[msg.rid] = item
        else:
            self._pending.append(item)

    def _abort(self, rid: int) -> None:
        if rid in self._inside:
            self.engine.abort(rid)
            return
        item = self._compiling.pop(rid, None)
        if item is None:
            item = next((w for w in self._pending if w.rid == rid), None)
            if item is not None:
                self._pending.remove(item)
        if item is not None:
            self._end_waiting(item, FinishReason.ABORT, None)

    def _end_waiting(self, item: _Waiting, reason: FinishReason, error: str | None) -> None:
        self._owner.pop(item.rid, None)
        event = FinishedEvent(item.rid, reason, len(item.prompt), 0, 0, error)
        self._fronts[item.frontend].outbox.append(event)

    def _frontend_gone(self, index: int) -> None:
        self._fronts[index].alive = False
        for rid, owner in list(self._owner.items()):
            if owner == index:
                self._abort(rid)

    def _abort_everything(self) -> None:
        self._stopped_intake = True
        for rid in list(self._owner):
            self._abort(rid)

    # ---- admission ---------------------------------------------------------------------
    def _check_compiles(self) -> None:
        now = time.monotonic()
        for rid, item in list(self._compiling.items()):
            assert item.future is not None
            if item.future.done():
                del self._compiling[rid]
                self._compiled(item, item.future)
            elif now >= item.deadline:
                del self._compiling[rid]
                assert item.params.constraint is not None
                budget = self._grammar.compile_timeout_s
                kind = item.params.constraint.kind
                message = f"constraint {kind} did not compile within {budget:g} s"
                self._refuse(item, f"{message} (compile_timeout_s)", "refused")

    def _compiled(self, item: _Waiting, future: Future[Any]) -> None:
        try:
            item.grammar = future.result().state()
        except GrammarBusy as exc:
            self._refuse(item, str(exc), "busy")
        except ValueError as exc:
            self._refuse(item, str(exc), "refused")
        except Exception as exc:  # a backend bug: this request fails, the engine goes on
            log.exception("grammar compile failed")
            self._refuse(item, f"constraint compile failed: {exc}", "unavailable")
        else:
            self._pending.append(item)

    def _refuse(self, item: _Waiting, message: str, kind: str) -> None:
        self._owner.pop(item.rid, None)
        self._fronts[item.frontend].refused.append((item.rid, message, kind))

    def _admit(self) -> None:
        """`resin.frontend.admission`'s rule (the engine actor's too); an aborted request
        left `_pending` when its abort was read, before this round."""
        outcomes = self._admission.admit(
            self.engine,
            len(self._inside),
            (self.policy.max_active, self.policy.admissions_per_step),
            lambda w: Entry(w.prompt, w.params, w.media, w.grammar, w.rid),
        )
        for outcome in outcomes:
            if outcome.kind == "entered":
                self._inside.add(outcome.item.rid)
            else:
                kind = "unavailable" if outcome.kind == "dead" else "refused"
                self._refuse(outcome.item, outcome.message, kind)

    # ---- messages out ------------------------------------------------------------------
    def _route(self, events: list[Event]) -> None:
        for event in events:
            if not isinstance(event, TokensEvent | FinishedEvent):
                log.warning("engine error event: %s", event.message)
                continue
            owner = self._owner.get(event.request_id)
            if owner is None:
                continue
            self._fronts[owner].outbox.append(event)
            if isinstance(event, FinishedEvent):
                del self._owner[event.request_id]
                self._inside.discard(event.request_id)

    def _flush(self) -> None:
        now = time.monotonic()
        status = self._dirty and now >= self._next_status
        metrics = b""
        if status:
            self._dirty = False
            self._next_status = now + self.policy.status_interval_s
            metrics = _metrics(self.engine)
        waiting = self.engine.num_waiting + len(self._pending) + len(self._compiling)
        running = self.engine.num_running
        for index, front in enumerate(self._fronts):
            if not front.alive or not (front.outbox or front.refused or status):
                continue
            out = wire.pack_outputs(front.outbox)
            out.refused, out.waiting, out.running, out.metrics = (
                front.refused,
                waiting,
                running,
                metrics,
            )
            front.outbox, front.refused = [], []
            if not self._send(front, out):
                log.warning("frontend %d stopped reading; aborting its requests", index)
                self._frontend_gone(index)

    def _send(self, front: _Frontend, message: wire.Message) -> bool:
        try:
            front.socket.send(wire.encode(message), zmq.NOBLOCK, copy=False)
        except zmq.Again:
            return False
        return True


def _metrics(engine: Any) -> bytes:
    """The engine's metrics snapshot, pickled (empty when it keeps none)."""
    import pickle

    snapshot = getattr(engine, "metrics", None)
    return b"" if snapshot is None else pickle.dumps(snapshot)
