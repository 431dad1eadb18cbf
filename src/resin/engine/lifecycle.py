"""How requests end: the one place a request is finished (or the engine dies).

`Lifecycle` is the outcome sink the `Transaction` reports to; the `Engine` uses it for aborts,
`close` and unfittable requests, the `ConstraintSet` for grammars that stop or fail. Finishing
takes the request out of the scheduler (its live table, its queue, its slot and pages:
`Scheduler.drop`), drops its grammar, records its metrics and returns its one
`FinishedEvent`.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from resin.engine.request import Request
from resin.engine.scheduler import Scheduler
from resin.events import ErrorEvent, Event, FinishedEvent, FinishReason
from resin.metrics.collector import MetricsCollector


class Lifecycle:
    """Request ids, finishing, and the dead flag (the live requests are the scheduler's)."""

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
        self.dead: str | None = None
        """Why the runner died (None while it lives)."""
        self._next_id = 0

    def take_id(self, request_id: int | None) -> int:
        """`request_id` checked to be a free int, or the next free automatic id."""
        live = self._scheduler.live
        if request_id is None:
            while self._next_id in live:
                self._next_id += 1
            self._next_id += 1
            return self._next_id - 1
        if isinstance(request_id, bool) or not isinstance(request_id, int):
            raise ValueError("request_id must be an int")
        if request_id in live:
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

        `cacheable=False` (quarantine) keeps its pages out of the prefix cache. A stop token or
        the length limit reached under a grammar whose last mask failed (a per-step limit) is
        that failure: the token came from an empty mask. (Those two reasons come from a
        committed token, so no mask of the request is filling: its matcher is free to read.)"""
        grammar = request.grammar
        ended = reason in (FinishReason.STOP, FinishReason.LENGTH)
        if ended and grammar is not None and (failure := grammar.mask_failure) is not None:
            reason, error, cacheable = FinishReason.ERROR, failure, False
        self._scheduler.drop(request, reason, error, cacheable)
        if self._release is not None:
            self._release(request)
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

    def finish_constrained(
        self, request: Request, reason: FinishReason, error: str | None
    ) -> FinishedEvent:
        """A grammar ended the request (`ConstraintSet.advance`): a grammar that refused the
        token (`error`) keeps its pages out of the prefix cache."""
        return self.finish(request, reason, error, cacheable=reason is not FinishReason.ERROR)

    def die(self, message: str, events: list[Event]) -> None:
        """The runner is gone: every live request ends with an error; `submit` raises."""
        self.dead = message
        live = self._scheduler.live
        events.append(ErrorEvent(message, tuple(live), retryable=False))
        for request in list(live.values()):
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
