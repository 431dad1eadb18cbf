"""`EngineService`: an engine process's `EngineLoop`, with zmq sockets as its transport.

The loop (`resin.frontend.engine_loop`, the same one `EngineActor` runs on a thread of the
server process) owns admission, the grammar-compile wait, stepping and shutdown: the policy
holds however many frontends submit. What is here is the transport (`_Sockets`): messages are
read without blocking between steps (the poll blocks only while idle), outputs go out without
blocking, one `Outputs` message per frontend per turn, with a status report (queue lengths,
metrics) at most every `status_interval_s`.

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
from dataclasses import dataclass, field
from typing import Any

import zmq
from zmq.utils.monitor import recv_monitor_message

from resin.events import Event, FinishedEvent, FinishReason
from resin.frontend.engine_loop import (
    DEFAULT_MAX_ACTIVE,
    EngineLoop,
    LoopPolicy,
    RefusalKind,
    Waiting,
)
from resin.ipc import wire

log = logging.getLogger("resin.ipc")

SEND_HWM = 100_000
"""Messages queued for one frontend before it counts as gone (it stopped reading)."""


@dataclass(frozen=True, slots=True)
class ServicePolicy:
    """The engine side's admission policy and status cadence."""

    max_active: int = DEFAULT_MAX_ACTIVE
    admissions_per_step: int = 4
    queue_capacity: int = 1024
    status_interval_s: float = 0.1


@dataclass(slots=True)
class _Frontend:
    socket: zmq.Socket[bytes]
    monitor: zmq.Socket[bytes]
    alive: bool = False
    """From its `Hello` until its socket disconnects."""
    outbox: list[Event] = field(default_factory=list)
    refused: list[tuple[int, str, str]] = field(default_factory=list)


class _Sockets:
    """The `Transport` of an engine process: one zmq PAIR socket per frontend. A request's
    key is its frontend's id for it (also its engine id); `origin` is the frontend's index."""

    def __init__(
        self, addresses: Sequence[str], policy: ServicePolicy, context: zmq.Context[Any]
    ) -> None:
        self.policy = policy
        self._context = context
        self.fronts = [self._bind(address) for address in addresses]
        self._poller = zmq.Poller()
        for front in self.fronts:
            self._poller.register(front.socket, zmq.POLLIN)
            self._poller.register(front.monitor, zmq.POLLIN)
        self.owner: dict[int, int] = {}  # rid -> frontend, from submit to its end
        self.ready: wire.Ready | None = None
        self._next_status = 0.0
        self._dirty = True  # something changed since the last status went out

    def _bind(self, address: str) -> _Frontend:
        sock: zmq.Socket[bytes] = self._context.socket(zmq.PAIR)
        sock.setsockopt(zmq.SNDHWM, SEND_HWM)
        sock.setsockopt(zmq.LINGER, 0)
        sock.bind(address)
        monitor = sock.get_monitor_socket(zmq.EVENT_DISCONNECTED)
        return _Frontend(sock, monitor)

    def close(self) -> None:
        for front in self.fronts:
            front.monitor.close(0)
            front.socket.close(0)

    # ---- messages in -------------------------------------------------------------------
    def poll(self, loop: EngineLoop[int], timeout_s: float | None) -> None:
        if timeout_s is None:  # idle: wake for the next status report, or for a signal
            timeout_s = self.policy.status_interval_s if self._dirty else 0.25
        ready = dict(self._poller.poll(int(timeout_s * 1000)))
        self._dirty = self._dirty or bool(ready)
        for index, front in enumerate(self.fronts):
            if front.monitor in ready:
                self._monitor(loop, index, front)
            if front.socket in ready:
                self._receive(loop, index, front)

    def _monitor(self, loop: EngineLoop[int], index: int, front: _Frontend) -> None:
        while front.monitor.poll(0):
            event = recv_monitor_message(front.monitor)
            if event["event"] == zmq.EVENT_DISCONNECTED and front.alive:
                owned = sum(1 for owner in self.owner.values() if owner == index)
                if owned:
                    log.warning("frontend %d went away; aborting its %d requests", index, owned)
                self._frontend_gone(loop, index)

    def _receive(self, loop: EngineLoop[int], index: int, front: _Frontend) -> None:
        while True:
            try:
                data = front.socket.recv(zmq.NOBLOCK, copy=True)
            except zmq.Again:
                return
            msg = wire.decode(data)
            if isinstance(msg, wire.Hello):
                front.alive = True
                assert self.ready is not None
                self._send(front, self.ready)
            elif isinstance(msg, wire.Submit):
                self._submitted(loop, index, front, msg)
            elif isinstance(msg, wire.Abort):
                loop.abort(msg.rid)

    def _submitted(
        self, loop: EngineLoop[int], index: int, front: _Frontend, msg: wire.Submit
    ) -> None:
        try:
            prompt, params, media = wire.read_submit(msg)
        except (ValueError, TypeError) as exc:
            front.refused.append((msg.rid, str(exc), "refused"))
            return
        self.owner[msg.rid] = index
        loop.submit(Waiting(msg.rid, prompt, params, media, request_id=msg.rid, origin=index))

    def _frontend_gone(self, loop: EngineLoop[int], index: int) -> None:
        self.fronts[index].alive = False
        for rid, owner in list(self.owner.items()):
            if owner == index:
                loop.abort(rid)

    # ---- Transport -----------------------------------------------------------------------
    def cancelled(self, item: Waiting[int]) -> bool:
        return False  # an abort reaches the loop itself, before admission

    def entered(self, item: Waiting[int], request_id: int) -> None:
        return

    def deliver(self, item: Waiting[int], events: list[Event]) -> None:
        self.fronts[item.origin].outbox.extend(events)
        if isinstance(events[-1], FinishedEvent):
            self.owner.pop(item.key, None)

    def refuse(self, item: Waiting[int], message: str, kind: RefusalKind) -> None:
        self.owner.pop(item.key, None)
        front = self.fronts[item.origin]
        if kind == "aborted":  # the frontend asked: the usual end of an aborted request
            front.outbox.append(FinishedEvent(item.key, FinishReason.ABORT, len(item.prompt), 0))
        else:
            front.refused.append((item.key, message, kind))

    def cut_off(self, item: Waiting[int]) -> None:
        return

    def closing(self) -> bool:
        return True

    def died(self, message: str) -> None:
        self.flush_status(None)

    def flush(self, loop: EngineLoop[int]) -> None:
        self.flush_status(loop)

    # ---- messages out ------------------------------------------------------------------
    def flush_status(self, loop: EngineLoop[int] | None) -> None:
        now = time.monotonic()
        self._dirty = self._dirty or (loop is not None and loop.stepped)
        status = self._dirty and now >= self._next_status
        engine = None if loop is None else loop.engine
        metrics = b""
        if status:
            self._dirty = False
            self._next_status = now + self.policy.status_interval_s
            metrics = _metrics(engine)
        waiting = 0 if loop is None else loop.engine.num_waiting + loop.queued
        running = 0 if loop is None else loop.engine.num_running
        for index, front in enumerate(self.fronts):
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
            if not self._send(front, out) and loop is not None:
                log.warning("frontend %d stopped reading; aborting its requests", index)
                self._frontend_gone(loop, index)

    def _send(self, front: _Frontend, message: wire.Message) -> bool:
        try:
            front.socket.send(wire.encode(message), zmq.NOBLOCK, copy=False)
        except zmq.Again:
            return False
        return True


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
        self._sockets = _Sockets(addresses, self.policy, context or zmq.Context())
        self._sockets.ready = self.ready()
        rule = LoopPolicy(
            self.policy.max_active, self.policy.admissions_per_step, self.policy.queue_capacity
        )
        self._loop: EngineLoop[int] = EngineLoop(engine, self._sockets, rule)

    def ready(self) -> wire.Ready:
        import os

        config = self.engine.runner_config
        grammar = getattr(self.engine, "grammar", None)
        return wire.Ready(
            pid=os.getpid(),
            context_length=_served_context(self.engine),
            vocab_size=int(config.vocab_size),
            page_size=int(self.engine.layout.page_size),
            has_grammar=grammar is not None,
            compile_timeout_s=float(getattr(grammar, "compile_timeout_s", 10.0)),
            metrics=_metrics(self.engine),
        )

    def request_stop(self) -> None:
        """Abort everything and end `run()` once the final events are out (signal-safe)."""
        self._loop.request_stop()

    @property
    def dead(self) -> bool:
        return bool(getattr(self.engine, "dead", False)) or self._loop.error is not None

    def run(self) -> None:
        """Step until `request_stop()`, or until the runner died."""
        self._loop.run()

    def close(self) -> None:
        self._sockets.close()


def _metrics(engine: Any) -> bytes:
    """The engine's metrics snapshot, pickled (empty when it keeps none)."""
    import pickle

    snapshot = getattr(engine, "metrics", None)
    return b"" if snapshot is None else pickle.dumps(snapshot)


def _served_context(engine: Any) -> int:
    """The context a frontend reports and enforces: the engine's, or the longest sequence its
    KV arena holds alone when that is shorter (as a one-process server clips it)."""
    context = int(engine.context_length)
    longest = getattr(getattr(engine, "arena", None), "longest_sequence", None)
    if longest is None or int(longest) >= context:
        return context
    log.warning(
        "the KV cache holds one sequence of %d tokens, not the context length %d: serving %d "
        "(a larger cache: `resin serve --kv-cache-memory`)",
        longest,
        context,
        longest,
    )
    return int(longest)
