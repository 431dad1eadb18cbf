"""The intake queue's slots, taken before a request is tokenized (so an overloaded frontend
refuses cheaply) and released when the request enters an engine or is refused. One
`IntakeSlots` per frontend: the data-parallel replicas' actors share it (`replicas.py`).
"""

from __future__ import annotations

import threading

from resin.frontend.errors import EngineUnavailable, QueueFull


class Reservation:
    """One intake slot, counted against its `owner` (a client connection) too; `release()` is
    idempotent and safe from any thread."""

    def __init__(self, slots: IntakeSlots, owner: object = None) -> None:
        self._slots = slots
        self._owner = owner
        self._held = True

    def release(self) -> None:
        if self._held:
            self._held = False
            self._slots.release(self._owner)


class IntakeSlots:
    """The intake queue's slots: `capacity` in all, counted per owner too (thread-safe)."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.accepting = True
        self._lock = threading.Lock()
        self._reserved = 0
        self._by_owner: dict[object, int] = {}

    @property
    def reserved(self) -> int:
        return self._reserved

    def reserve_many(
        self, count: int, owner: object = None, owner_limit: int | None = None
    ) -> list[Reservation]:
        """`count` slots at once, or none: QueueFull when the queue (or `owner`'s share of it,
        `owner_limit`) has no room, EngineUnavailable when stopping (never blocks)."""
        with self._lock:
            if not self.accepting:
                raise EngineUnavailable("engine unavailable: server is shutting down")
            if self._reserved + count > self.capacity:
                raise QueueFull(f"server busy: {self._reserved} requests queued")
            mine = self._by_owner.get(owner, 0)
            if owner is not None and owner_limit is not None and mine + count > owner_limit:
                raise QueueFull(f"server busy: this connection already has {mine} requests queued")
            self._reserved += count
            if owner is not None:
                self._by_owner[owner] = mine + count
        return [Reservation(self, owner) for _ in range(count)]

    def release(self, owner: object = None) -> None:
        with self._lock:
            self._reserved -= 1
            if owner is not None:
                left = self._by_owner.pop(owner, 1) - 1
                if left:
                    self._by_owner[owner] = left


class SlotsFront:
    """What a front (`EngineActor`, `ReplicaSet`) shows of its intake slots."""

    slots: IntakeSlots

    @property
    def queue_capacity(self) -> int:
        return self.slots.capacity

    @property
    def queued(self) -> int:
        """Slots taken and not yet released (requests not yet inside an engine)."""
        return self.slots.reserved
