"""`EngineLoop`: the one loop that drives an engine, whatever carries its requests.

It runs on the thread that owns the engine: a thread of the server process (`EngineActor`,
`actor.py`, requests from the event loop through a queue) or the main thread of an engine
process (`resin.ipc.EngineService`, requests from frontend processes through zmq sockets). The
two differ only in their `Transport`: how messages arrive (`poll`) and where each request's
outcome goes (`entered`, `deliver`, `refuse`, `flush`). Everything else is here, once:

- admission (`admission.py`'s rule, the `LoopPolicy` knobs: `max_active` inside the engine,
  `admissions_per_step` entering a step, `queue_capacity` waiting, then `busy`);
- the grammar-compile wait: a constrained request compiles on the grammar backend's own
  threads (`prepare`) while the engine steps, is polled between steps, and enters once
  compiled, or is refused (`refused`: the spec fails or `compile_timeout_s` passed; `busy`:
  too many compiles queued);
- stepping, routing each step's events to their requests (one `deliver` per request per step,
  its finish last), stall tracking (`busy_since`);
- shutdown (`request_stop`, signal-safe): requests still waiting or compiling are refused, the
  ones inside are aborted and end with the engine's final events, then `run()` returns; a dead
  engine (a step raised, or `engine.dead`) refuses every request it holds (`unavailable`).

Invariants: every request the transport submitted gets exactly one end, a `FinishedEvent`
through `deliver` or one `refuse`; the loop never blocks while the engine has work (it polls
without waiting, or `WAIT_ON_DEVICE_S` after a step that returned nothing, so an overlapped
runner's thread gets the GIL instead of a spinning loop).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Hashable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any, Generic, Literal, Protocol, TypeVar

from resin.errors import GrammarBusy
from resin.events import Event, FinishedEvent, TokensEvent
from resin.frontend.admission import Admission, Entry
from resin.frontend.ports import Refusal
from resin.params import Constraint, SamplingParams
from resin.plan import MediaItem

log = logging.getLogger("resin.frontend")

K = TypeVar("K", bound=Hashable)

WAIT_ON_DEVICE_S = 0.001
"""The poll's wait after a step that returned no events (the device is still busy)."""

COMPILE_POLL_S = 0.005
"""The poll's wait while idle with grammars compiling (how late a compile is noticed)."""

DEFAULT_MAX_ACTIVE = 1024
"""Requests inside the engine at once unless told otherwise (`--max-active`). It must not be
below the engine's batch (`max_sequences`: 256 on a GPU, 512 for the zero-cost runner), or
admission rather than the scheduler caps the batch; requests inside the engine beyond the batch
wait in the scheduler's own queue, where they hold no cache until they run. vLLM's
`max_num_seqs` on a large GPU is the same 1,024."""

RefusalKind = Literal["refused", "busy", "unavailable", "aborted"]
"""`refused`: bad input (a 400); `busy`: retry later (a 429); `unavailable`: the engine died or
is stopping (a 503); `aborted`: the sender aborted it before it entered the engine."""


@dataclass(frozen=True, slots=True)
class LoopPolicy:
    """The admission knobs, the same whatever the transport."""

    max_active: int = DEFAULT_MAX_ACTIVE
    admissions_per_step: int = 4
    queue_capacity: int = 1024


@dataclass(slots=True, eq=False)
class Waiting(Generic[K]):
    """One request from its submit until it enters the engine (then until its end)."""

    key: K
    """The transport's name for the request (a stream, a frontend's request id)."""
    prompt: Sequence[int]
    params: SamplingParams
    media: tuple[MediaItem, ...] = ()
    request_id: int | None = None
    """The engine id to use (an engine process takes its frontends' ids); None: the engine's."""
    origin: Any = None
    """The transport's own data (an intake reservation, the sending frontend)."""
    grammar: object = None
    compiled: Future[Any] | None = None
    deadline: float = 0.0


class Transport(Protocol[K]):
    """How requests reach an `EngineLoop` and how their outcomes leave it."""

    def poll(self, loop: EngineLoop[K], timeout_s: float | None) -> None:
        """Read the messages that arrived, waiting at most `timeout_s` for the first (None:
        the loop is idle, as long as suits the transport), and hand each to `loop.submit`,
        `loop.abort` or `loop.request_stop`."""

    def cancelled(self, item: Waiting[K]) -> bool:
        """Whether the request's client already left (it is dropped at admission)."""

    def entered(self, item: Waiting[K], request_id: int) -> None:
        """The request is inside the engine under `request_id`."""

    def deliver(self, item: Waiting[K], events: list[Event]) -> None:
        """One step's events of a request inside the engine (a `FinishedEvent` last)."""

    def refuse(self, item: Waiting[K], message: str, kind: RefusalKind) -> None:
        """The request ended without a `FinishedEvent`."""

    def cut_off(self, item: Waiting[K]) -> None:
        """The request inside the engine is aborted by a shutdown (its finish follows)."""

    def flush(self, loop: EngineLoop[K]) -> None:
        """End of a turn: send what `deliver` and `refuse` gathered."""

    def closing(self) -> bool:
        """The loop is stopping and idle: True if nothing can still arrive (it ends)."""

    def died(self, message: str) -> None:
        """The engine died (every request the loop held was refused already)."""


class EngineLoop(Generic[K]):
    """Drives `engine` for the requests `transport` brings; `run()` on the engine's thread."""

    def __init__(
        self, engine: Any, transport: Transport[K], policy: LoopPolicy | None = None
    ) -> None:
        self.engine = engine
        self.transport = transport
        self.policy = policy or LoopPolicy()
        self._admission: Admission[Waiting[K]] = Admission()
        self.waiting = self._admission.waiting
        """Requests ready to enter, in arrival order."""
        self.compiling: dict[K, Waiting[K]] = {}
        self.inside: dict[int, Waiting[K]] = {}
        """Requests inside the engine, by engine request id."""
        self._ids: dict[K, int] = {}
        self.stopping = False
        self._stop_done = False
        self.abandoned = False
        self.error: str | None = None
        """Why the engine died (None while it serves)."""
        self.busy_since: float | None = None
        """While work is queued or running: when the engine last made progress (a step that
        returned events, or work arriving); None while idle."""
        self.stepped = False
        """Whether this turn stepped the engine (transports report status after such turns)."""
        self._wait = 0.0
        backend = getattr(engine, "grammar", None)
        self._compiler = backend if callable(getattr(backend, "prepare", None)) else None

    @property
    def queued(self) -> int:
        """Requests not yet inside the engine (waiting or compiling)."""
        return len(self.waiting) + len(self.compiling)

    # ---- messages (the transport calls these from `poll`) ------------------------------
    def submit(self, item: Waiting[K]) -> None:
        if self.stopping:
            self.transport.refuse(item, "server is shutting down", "unavailable")
        elif self.queued >= self.policy.queue_capacity:
            self.transport.refuse(item, "engine busy: its queue is full", "busy")
        elif item.params.constraint is not None and self._compiler is not None:
            item.compiled = _prepare(self._compiler, item.params.constraint)
            item.deadline = time.monotonic() + float(self._compiler.compile_timeout_s)
            self.compiling[item.key] = item
        else:
            self.waiting.append(item)

    def abort(self, key: K) -> None:
        """Abort a request: inside the engine its pages are freed (its finish follows);
        waiting or compiling, it is refused (`aborted`); unknown (ended already): nothing."""
        rid = self._ids.get(key)
        if rid is not None:
            self.engine.abort(rid)
            return
        item = self.compiling.pop(key, None)
        if item is None:
            item = next((w for w in self.waiting if w.key == key), None)
            if item is not None:
                self.waiting.remove(item)
        if item is not None:
            self.transport.refuse(item, "aborted", "aborted")

    def request_stop(self) -> None:
        """Abort everything and end `run()` once the final events are out (signal-safe)."""
        self.stopping = True

    def abandon(self) -> None:
        """End `run()` at its next turn without waiting for the engine (it does not answer)."""
        self.abandoned = True

    # ---- the loop ----------------------------------------------------------------------
    def run(self) -> None:
        """Turn until stopped, abandoned or the engine died."""
        while True:
            try:
                if self._turn():
                    return
            except Exception as exc:
                log.exception("engine loop failed")
                self._die(f"engine failed: {exc}")
                return

    def _turn(self) -> bool:
        """One turn: messages, compiles, admission, one step, delivery. True: the end."""
        if self.abandoned:
            return True
        self.stepped = False
        busy = bool(self.waiting) or self.engine.has_work()
        if not busy:
            self.busy_since = None
        elif self.busy_since is None:
            self.busy_since = time.monotonic()
        ended = self.stopping and self._stop_done and not busy and not self.compiling
        if ended and self.transport.closing():
            self.transport.flush(self)
            return True
        timeout = self._wait if busy else COMPILE_POLL_S if self.compiling else None
        self.transport.poll(self, timeout)
        if self.abandoned:
            return True
        if self.stopping and not self._stop_done:
            self._abort_all()
        self._check_compiles()
        self._admit()
        if self.engine.has_work():
            self.stepped = True
            events = self.engine.step()
            if events:
                self.busy_since = time.monotonic()
            self._wait = 0.0 if events else WAIT_ON_DEVICE_S
            self._route(events)
            if getattr(self.engine, "dead", False):
                self._die("the engine stopped (runner failure)")
                return True
        self.transport.flush(self)
        return False

    def _check_compiles(self) -> None:
        now = time.monotonic()
        for key, item in list(self.compiling.items()):
            assert item.compiled is not None and item.params.constraint is not None
            if item.compiled.done():
                del self.compiling[key]
                self._compiled(item, item.compiled)
            elif now >= item.deadline:
                del self.compiling[key]
                budget = float(getattr(self._compiler, "compile_timeout_s", 0.0))
                kind = item.params.constraint.kind
                message = f"constraint {kind} did not compile within {budget:g} s"
                self.transport.refuse(item, f"{message} (compile_timeout_s)", "refused")

    def _compiled(self, item: Waiting[K], future: Future[Any]) -> None:
        try:
            item.grammar = future.result().state()
        except GrammarBusy as exc:
            self.transport.refuse(item, str(exc), "busy")
        except ValueError as exc:
            self.transport.refuse(item, str(exc), "refused")
        except Exception as exc:  # a backend bug: this request fails, the engine goes on
            log.exception("grammar compile failed")
            self.transport.refuse(item, f"constraint compile failed: {exc}", "unavailable")
        else:
            self.waiting.append(item)

    def _admit(self) -> None:
        outcomes = self._admission.admit(
            self.engine,
            len(self.inside),
            (self.policy.max_active, self.policy.admissions_per_step),
            lambda w: Entry(w.prompt, w.params, w.media, w.grammar, w.request_id),
            self.transport.cancelled,
        )
        for outcome in outcomes:
            item = outcome.item
            if outcome.kind == "entered":
                assert outcome.request_id is not None
                self.inside[outcome.request_id] = item
                self._ids[item.key] = outcome.request_id
                self.transport.entered(item, outcome.request_id)
            elif outcome.kind == "dead":
                self.waiting.appendleft(item)
                raise RuntimeError(outcome.message)
            elif outcome.kind == "dropped":
                self.transport.refuse(item, "aborted", "aborted")
            else:
                self.transport.refuse(item, outcome.message, "refused")

    def _route(self, events: Sequence[Event | Refusal]) -> None:
        """Each request's events of the step to `deliver` at once, its finish last. Runs over
        every event of every step (hundreds a step at a large batch): one dict lookup per
        event, the type compared exactly (the event classes are final)."""
        batches: dict[int, list[Event]] = {}
        get = batches.get
        for event in events:
            kind = type(event)
            if kind is TokensEvent or kind is FinishedEvent:
                rid = event.request_id  # type: ignore[union-attr]
                batch = get(rid)
                if batch is None:
                    batches[rid] = [event]  # type: ignore[list-item]
                else:
                    batch.append(event)  # type: ignore[arg-type]
            elif isinstance(event, Refusal):
                item = self._leave(event.request_id)
                if item is not None:
                    self.transport.refuse(item, event.message, event.kind)
            else:
                log.warning("engine error event: %s", getattr(event, "message", event))
        inside, deliver = self.inside, self.transport.deliver
        for rid, batch in batches.items():
            item = inside.get(rid)
            if item is None:
                continue
            if type(batch[-1]) is FinishedEvent:
                self._leave(rid)
            deliver(item, batch)

    def _leave(self, rid: int) -> Waiting[K] | None:
        item = self.inside.pop(rid, None)
        if item is not None:
            self._ids.pop(item.key, None)
        return item

    def _abort_all(self) -> None:
        self._stop_done = True
        for item in [*self.compiling.values(), *self.waiting]:
            self.transport.refuse(item, "server is shutting down", "unavailable")
        self.compiling.clear()
        self.waiting.clear()
        for rid, item in list(self.inside.items()):
            self.transport.cut_off(item)
            self.engine.abort(rid)

    def _die(self, message: str) -> None:
        self.error = message
        items = [*self.compiling.values(), *self.waiting, *self.inside.values()]
        self.compiling.clear()
        self.waiting.clear()
        self.inside.clear()
        self._ids.clear()
        for item in items:
            self.transport.refuse(item, message, "unavailable")
        self.transport.died(message)


def _prepare(compiler: Any, constraint: Constraint) -> Future[Any]:
    """`compiler.prepare(constraint)`; a backend that raises at once gives a failed future."""
    try:
        future: Future[Any] = compiler.prepare(constraint)
    except Exception as exc:
        future = Future()
        future.set_exception(exc)
    return future
