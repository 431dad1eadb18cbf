"""Requests waiting in the intake while their grammar compiles off the engine thread.

The engine actor hands a constrained request here instead of to its engine thread: the
constraint compiles on the grammar backend's own threads (`ConstraintCompiler.prepare`), and
the request goes on (`enter`, with its grammar state) when that is done, or is refused
(`refuse`): a spec that fails to compile ("refused", a 400), too many compiles queued ("busy",
a 429), or `compile_timeout_s` spent ("refused"; a compile still running then finishes into
the backend's cache). Exactly one of `enter`, `refuse` or a `claim` (abort, shutdown) takes
each request. Thread-safe: compiles end on compile threads, timeouts fire on the event loop.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any, Generic, TypeVar

from resin.errors import GrammarBusy
from resin.frontend.ports import ConstraintCompiler
from resin.frontend.stream import RequestStream, StreamError
from resin.params import Constraint

log = logging.getLogger("resin.frontend")
T = TypeVar("T")


class Compiling(Generic[T]):
    """Requests (`T`, the actor's submit messages) waiting for their grammar, by stream."""

    def __init__(
        self, enter: Callable[[T, object], None], refuse: Callable[[T, StreamError], None]
    ) -> None:
        self._enter = enter
        self._refuse = refuse
        self._lock = threading.Lock()
        self._waiting: dict[RequestStream, T] = {}

    def start(
        self,
        stream: RequestStream,
        item: T,
        constraint: Constraint,
        compiler: ConstraintCompiler,
        loop: asyncio.AbstractEventLoop | None,
    ) -> None:
        """`item` (the request read from `stream`) waits for `constraint` to compile (call
        on the event loop `loop`, which times the compile)."""
        with self._lock:
            self._waiting[stream] = item
        budget = compiler.compile_timeout_s
        if loop is not None:
            loop.call_later(budget, self._expire, stream, constraint.kind, budget)
        future = compiler.prepare(constraint)
        future.add_done_callback(lambda f: self._compiled(stream, f))

    def claim(self, stream: RequestStream) -> T | None:
        """Take a request still waiting (None when it went on or was refused already)."""
        with self._lock:
            return self._waiting.pop(stream, None)

    def take_all(self) -> list[T]:
        with self._lock:
            items, self._waiting = list(self._waiting.values()), {}
        return items

    def _compiled(self, stream: RequestStream, future: Future[Any]) -> None:
        item = self.claim(stream)
        if item is None:  # it ran out of time, was aborted, or the actor stopped meanwhile
            return
        try:
            state = future.result().state()
        except GrammarBusy as exc:
            self._refuse(item, StreamError(str(exc), "busy"))
        except ValueError as exc:
            self._refuse(item, StreamError(str(exc), "refused"))
        except Exception as exc:  # a backend bug: this request fails, the engine goes on
            log.exception("grammar compile failed")
            self._refuse(item, StreamError(f"constraint compile failed: {exc}"))
        else:
            self._enter(item, state)

    def _expire(self, stream: RequestStream, kind: str, budget: float) -> None:
        item = self.claim(stream)
        if item is not None:
            message = f"constraint {kind} did not compile within {budget:g} s (compile_timeout_s)"
            self._refuse(item, StreamError(message, "refused"))
