"""Live requests and how they end: the one place a request is finished (or the engine dies).

`Lifecycle` is the outcome sink the `Transaction` reports to; the `Engine` uses it for aborts,
`close` and unfittable requests. Finishing frees the request's pages (through the scheduler),
records its metrics and returns its one `FinishedEvent`.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from resin.engine.request import Request
from resin.engine.scheduler import Scheduler
from resin.events import ErrorEvent, Event, FinishedEvent, FinishReason
from resin.metrics.collector import MetricsCollector


class Lifecycle:
    """Owns the live-request table and the dead flag."""

    def __init__(
        self,
        scheduler: Scheduler,
        collector: MetricsCollector | None,
        release: Callable[[Request], None] | None = None,
    ) -> None:
        self._scheduler = scheduler
        self._collector = collector
        self._release = release
        """Drops per-request state other owners keep (the grammar of a constrained request)."""
        self.live: dict[int, Request] = {}
        self.dead: str | None = None
        """Why the runner died (None while it lives)."""
        self._next_id = 0

    def add(self, request: Request) -> None:
        self.live[request.id] = request

    def take_id(self, request_id: int | None) -> int:
        """`request_id` checked to be a free int, or the next free automatic id."""
        if request_id is None:
            while self._next_id in self.live:
                self._next_id += 1
            self._next_id += 1
            return self._next_id - 1
        if isinstance(request_id, bool) or not isinstance(request_id, int):
            raise ValueError("request_id must be an int")
        if request_id in self.live:
            raise ValueError(f"request id {request_id} is already in use")
        return request_id

    def finish(
        self,
        request: Request,
        reason: FinishReason,
        error: str | None = None,
        *,
        cacheable: bool = True,
    ) -> FinishedEvent:
        """End a request: free its pages, record metrics, return its one `FinishedEvent`.

        `cacheable=False` (quarantine) keeps its pages out of the prefix cache."""
        self._scheduler.finish(request, cacheable=cacheable)
        if self._release is not None:
            self._release(request)
        self.live.pop(request.id, None)
        request.finish_reason = reason
        request.error = error
        if self._collector is not None:
            self._record(request, reason)
        return FinishedEvent(
            request.id,
            reason,
            request.num_prompt_tokens,
            len(request.output_token_ids),
            request.cached_tokens,
            error,
        )

    def die(self, message: str, events: list[Event]) -> None:
        """The runner is gone: every live request ends with an error; `submit` raises."""
        self.dead = message
        events.append(ErrorEvent(message, tuple(self.live), retryable=False))
        for request in list(self.live.values()):
            events.append(self.finish(request, FinishReason.ERROR, message))

    def _record(self, request: Request, reason: FinishReason) -> None:
        c = self._collector
        assert c is not None
        t = request.times
        now = time.monotonic()
        with c.lock:
            c.success[reason.value] += 1
            c.e2e.observe(now - t.arrival)
            if t.admitted:
                c.queue_time.observe(t.admitted - t.arrival)
            if t.first_token:
                c.prefill_time.observe(t.first_token - t.admitted)
                c.decode_time.observe(max(0.0, t.last_token - t.first_token))
