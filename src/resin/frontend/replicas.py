"""Data-parallel serving: N engine replicas behind one front (`resin serve --data-parallel N`).

Each replica is an `EngineActor` over its own engine: its own thread, runner (a device or a
tensor-parallel group) and cache. They share one intake queue (`IntakeSlots`): a request
reserves its slots before tokenizing, as with one engine, so 429s and per-connection shares
are server-wide. Once the prompt is known, `route()` picks the replica (`routing.choose`:
a replica the client named, else the one whose cache holds the longest prefix of the prompt
when that is at least half of it, else the least loaded), and every generation of that
prompt (`n` > 1 choices) goes there for its whole life: its events, aborts and pages stay
with that replica.

A replica's load is `EngineActor.load`: the requests routed to it whose streams are still
open (counted on the event loop, where routing runs). Its cache hit is `Engine.cached_prefix`,
a read-only walk of its prefix trie from the event loop (a hint: admission does the real
match).

A replica that dies (its runner failed) fails its own open requests (its actor's stream
errors; a server answers 503), routing skips it, and the others keep serving. `alive` is
False from then on (a server's health check reports the process degraded, so an orchestrator
replaces it); `on_death` runs only when the last replica died, as with one engine.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence

from resin.frontend.actor import EngineActor
from resin.frontend.engine_loop import DEFAULT_MAX_ACTIVE
from resin.frontend.errors import EngineUnavailable
from resin.frontend.intake_slots import IntakeSlots, Reservation, SlotsFront
from resin.frontend.ports import EngineLike
from resin.frontend.replica_routing import ReplicaState, choose
from resin.plan import MediaItem

log = logging.getLogger("resin.frontend")


class ReplicaSet(SlotsFront):
    """Several `EngineActor`s behind one intake (the front's side of `EngineActor`'s surface:
    reserve, route, start and stop; `alive` while every replica is)."""

    def __init__(
        self,
        engines: Sequence[EngineLike],
        *,
        queue_capacity: int = 1024,
        max_active: int = DEFAULT_MAX_ACTIVE,
        admissions_per_step: int = 4,
        stream_capacity: int = 64,
        on_death: Callable[[], None] | None = None,
    ) -> None:
        self.slots = IntakeSlots(queue_capacity)
        self.stream_capacity = stream_capacity
        self.on_death = on_death
        self.replicas = [
            EngineActor(
                engine,
                max_active=max_active,
                admissions_per_step=admissions_per_step,
                stream_capacity=stream_capacity,
                on_death=self._replica_died,
                slots=self.slots,
            )
            for engine in engines
        ]
        self._turn = 0

    @property
    def alive(self) -> bool:
        return all(r.alive for r in self.replicas)

    @property
    def has_grammar(self) -> bool:
        return all(r.has_grammar for r in self.replicas)

    @property
    def error(self) -> str | None:
        dead = [f"replica {i}: {r.error}" for i, r in enumerate(self.replicas) if r.error]
        return "; ".join(dead) or None

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        for replica in self.replicas:
            replica.start(loop)

    def reserve_many(
        self, count: int, owner: object = None, owner_limit: int | None = None
    ) -> list[Reservation]:
        if not any(r.alive for r in self.replicas):
            raise self._unavailable()
        return self.slots.reserve_many(count, owner, owner_limit)

    def route(
        self, prompt: Sequence[int], media: Sequence[MediaItem] = (), replica: int | None = None
    ) -> EngineActor:
        """The replica for one prompt (`routing.choose`); EngineUnavailable when none lives."""
        states = [
            ReplicaState(actor.alive, actor.load, _cached(actor.engine, prompt, media))
            for actor in self.replicas
        ]
        pick = choose(states, len(prompt), requested=replica, turn=self._turn)
        if pick is None:
            raise self._unavailable()
        self._turn += 1
        return self.replicas[pick]

    def request_stop(self) -> None:
        for replica in self.replicas:
            replica.request_stop()

    def stop(self, timeout: float = 10.0) -> None:
        self.request_stop()
        for replica in self.replicas:
            replica.stop(timeout)

    def _unavailable(self) -> EngineUnavailable:
        return EngineUnavailable(f"engine unavailable: {self.error or 'no replica is running'}")

    def _replica_died(self) -> None:
        log.error("data-parallel replica died: %s", self.error)
        if self.on_death is not None and not any(r.alive for r in self.replicas):
            self.on_death()


def _cached(engine: EngineLike, prompt: Sequence[int], media: Sequence[MediaItem]) -> int:
    """`Engine.cached_prefix`; an engine without that hint (a test double) holds nothing."""
    hint = getattr(engine, "cached_prefix", None)
    return int(hint(prompt, media)) if hint is not None else 0
