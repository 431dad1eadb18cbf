"""What the frontend needs from the engine and from an output parser, as Protocols.

It runs on the real `resin.Engine` and a recipe's `ResponseParser` (or
`resin.recipe.plain.PlainTextParser`); the tests' doubles (`tests/server/doubles.py`)
implement the same contracts.
"""

from __future__ import annotations

from collections.abc import Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any, Literal, Protocol

from resin.events import Event
from resin.params import Constraint, SamplingParams
from resin.plan import MediaItem
from resin.recipe.deltas import Delta, ParseResult

__all__ = [
    "CompiledConstraint",
    "ConstraintCompiler",
    "EngineLike",
    "OutputParser",
    "Refusal",
    "RequestHandle",
]


@dataclass(frozen=True, slots=True)
class Refusal:
    """A submitted request an engine did not take, reported by a later `step()` instead of
    by `submit` raising (an engine in another process, `resin.ipc.EngineClient`): it gets no
    `FinishedEvent`. `kind` as `StreamError.kind`: `refused` (bad input, a 400), `busy` (a
    429), `unavailable` (a 503)."""

    request_id: int
    message: str
    kind: Literal["refused", "busy", "unavailable"]


class RequestHandle(Protocol):
    """The part of `resin.Request` the frontend reads."""

    @property
    def id(self) -> int: ...


class EngineLike(Protocol):
    """A synchronous engine driven by exactly one thread (the frontend's actor)."""

    @property
    def context_length(self) -> int: ...

    @property
    def num_waiting(self) -> int: ...

    @property
    def num_running(self) -> int: ...

    def submit(
        self,
        prompt_token_ids: Sequence[int],
        sampling_params: SamplingParams | None = None,
        *,
        media: Sequence[MediaItem] = (),
    ) -> RequestHandle: ...

    def step(self) -> Sequence[Event | Refusal]: ...

    def abort(self, request: Any) -> None: ...

    def has_work(self) -> bool: ...

    def close(self) -> None: ...


class OutputParser(Protocol):
    """Turns generated token ids into typed deltas, incrementally (a recipe's
    `ResponseParser`, or `resin.recipe.plain.PlainTextParser`); `finish` flushes."""

    def feed(self, token_ids: Sequence[int]) -> list[Delta]: ...

    def finish(self, reason: Literal["stop", "length"] = "stop") -> ParseResult: ...


class CompiledConstraint(Protocol):
    """A compiled constraint (`resin.engine.grammar.CompiledGrammar`)."""

    def state(self) -> object: ...


class ConstraintCompiler(Protocol):
    """An engine's grammar backend as the intake uses it (`GrammarBackend`): compiles off
    the engine thread; the state it yields goes to `Engine.submit(..., grammar=)`."""

    @property
    def compile_timeout_s(self) -> float: ...

    def prepare(self, constraint: Constraint) -> Future[CompiledConstraint]: ...
