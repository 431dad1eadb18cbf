"""Admission: the one rule by which waiting requests enter an engine, shared by the engine
actor (`actor.py`, a thread in the server process) and the engine process's loop
(`resin.ipc.service.EngineService`); only what each does with the outcome differs (a stream
item there, a message to a frontend here).

Rule, per engine step: arrival order; at most `per_step` requests enter and at most
`max_active` are inside the engine at once. A request whose client already left
(`cancelled(item)`) is dropped at admission, never submitted (a burst of closed streams costs
no prefill); a `ValueError` from `engine.submit` refuses that request with its message; an
`EngineDeadError` ends the round (the item is the last outcome, `dead`).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Generic, Literal, TypeVar

from resin.errors import EngineDeadError
from resin.params import SamplingParams
from resin.plan import MediaItem

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Entry:
    """What `engine.submit` gets for one waiting request."""

    prompt: Sequence[int]
    params: SamplingParams
    media: tuple[MediaItem, ...] = ()
    grammar: object = None
    request_id: int | None = None
    """The caller's id (an engine process takes its frontends' ids); None: the engine's."""


@dataclass(frozen=True, slots=True)
class Outcome(Generic[T]):
    item: T
    kind: Literal["entered", "refused", "dropped", "dead"]
    request_id: int | None = None
    """The engine's id of an `entered` request."""
    message: str = ""
    """Why it was `refused` (the engine's `ValueError`) or the engine is `dead`."""


class Admission(Generic[T]):
    """Waiting requests (any type `T`, in arrival order) and the rule that lets them into an
    engine; the owner adds to and removes from `waiting` itself (aborts, shutdown)."""

    def __init__(self) -> None:
        self.waiting: deque[T] = deque()

    def admit(
        self,
        engine: Any,
        inside: int,
        limits: tuple[int, int],
        entry: Callable[[T], Entry],
        cancelled: Callable[[T], bool] = lambda item: False,
    ) -> list[Outcome[T]]:
        """One round: `inside` requests are in the engine now, `limits` is (`max_active`,
        `per_step`); what happened to each item taken from the front of `waiting`, in
        order."""
        max_active, per_step = limits
        out: list[Outcome[T]] = []
        entered = 0
        while self.waiting and entered < per_step and inside + entered < max_active:
            item = self.waiting.popleft()
            if cancelled(item):
                out.append(Outcome(item, "dropped"))
                continue
            e = entry(item)
            given = (("media", e.media), ("grammar", e.grammar), ("request_id", e.request_id))
            extra = {k: v for k, v in given if v is not None and v != ()}  # doubles know neither
            try:
                handle = engine.submit(e.prompt, e.params, **extra)
            except EngineDeadError as exc:
                out.append(Outcome(item, "dead", message=str(exc)))
                return out
            except ValueError as exc:
                out.append(Outcome(item, "refused", message=str(exc)))
                continue
            out.append(Outcome(item, "entered", int(getattr(handle, "id", e.request_id or 0))))
            entered += 1
        return out
