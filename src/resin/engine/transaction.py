"""One step's transaction: run the plan, then commit it or apply the failure policy.

reserve (done by the engine) -> runner -> validate -> commit. The synchronous step
(`Transaction.execute`) and the overlapped one (`engine/pipeline.py`) share the public parts:
`check` (validation), `commit`, and the failure policy, `StepFailure.of` (the one ladder) plus
`undo` (the reservation) and `fail` (the requests). Outcomes:
- `RetryableRunnerError` before acceptance: roll the reservation back; the requests stay where
  they were and run again; after `max_retries` consecutive failures a request ends with `error`.
- `RunnerDeadError`: the engine dies (every request ends with `error`).
- any other exception, or an invalid output: the plan's requests are quarantined (end with
  `error`, pages freed, never cached); other requests go on.
A failure while handing the plan over (`forward` refusing it, `submit` raising) rolls the
reservation back; once the runner has the plan (`forward` failing after acceptance, `collect`
raising, an invalid output) the reservation is abandoned: its pages go with the requests.
"""

from __future__ import annotations

import enum
import time
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field, fields
from itertools import repeat
from operator import attrgetter
from typing import Protocol

import numpy as np
import numpy.typing as npt

from resin.cache.manager import PageReservation
from resin.engine.outputs import collect_prompt_logprobs, token_logprobs
from resin.engine.request import Request
from resin.engine.scheduler import Scheduler
from resin.engine.speculative import commit_drafts
from resin.engine.validate import validate_output
from resin.errors import RetryableRunnerError, RunnerDeadError
from resin.events import ErrorEvent, Event, FinishedEvent, FinishReason, TokensEvent
from resin.metrics.collector import MetricsCollector
from resin.plan import BatchPlan, ForwardOutput, Phase
from resin.protocols import AsyncRunner, Runner

I32 = npt.NDArray[np.int32]

_ID = attrgetter("id")
_CACHED = attrgetter("cached_tokens")
_OUTPUT = attrgetter("output_token_ids")
_TIMES = attrgetter("times")
_LAST = attrgetter("times.last_token")
_STARTED = attrgetter("started")
_RETRIES = attrgetter("retries")
_EVENT_FIELDS = (
    "request_id",
    "token_ids",
    "logprobs",
    "top_logprobs",
    "prompt_logprobs",
    "prompt_top_logprobs",
    "cached_tokens",
)
assert tuple(f.name for f in fields(TokensEvent)) == _EVENT_FIELDS
assert not hasattr(TokensEvent, "__post_init__")
_SLOTS = [TokensEvent.__dict__[name] for name in _EVENT_FIELDS]


def token_events(
    ids: Iterable[int], tokens: Iterable[int], cached: Iterable[int], n: int
) -> list[TokensEvent]:
    """`[TokensEvent(id, (token,), cached_tokens=c) ...]` for `n` rows, built field by field
    over the whole batch (each pass a C-level loop) instead of one frozen-dataclass
    `__init__` per row, the bulk of a large decode step's CPU. Equal objects of the same
    type; the asserts above fail at import if `TokensEvent` changes shape."""
    events = list(map(object.__new__, repeat(TokensEvent, n)))
    request_id, token_ids, *optional, cached_tokens = _SLOTS
    deque(map(request_id.__set__, events, ids), maxlen=0)
    deque(map(token_ids.__set__, events, zip(tokens)), maxlen=0)
    for slot in optional:
        deque(map(slot.__set__, events, repeat(None)), maxlen=0)
    deque(map(cached_tokens.__set__, events, cached), maxlen=0)
    return events


class OutcomeSink(Protocol):
    """Where a transaction reports requests that end (`engine.lifecycle.Lifecycle`)."""

    def finish(
        self,
        request: Request,
        reason: FinishReason,
        error: str | None = None,
        *,
        cacheable: bool = True,
    ) -> FinishedEvent: ...

    def die(self, message: str, events: list[Event]) -> None: ...


class Verdict(enum.Enum):
    """What a failed step means for its requests."""

    RETRY = "retry"
    """Refused before acceptance: the requests run again later (bounded)."""
    QUARANTINE = "quarantine"
    """Failed after acceptance, or answered invalidly: the requests end with `error`."""
    DEAD = "dead"
    """The runner is gone: every live request ends with `error`."""


@dataclass(frozen=True, slots=True)
class StepFailure:
    """A step that did not commit: the verdict, the message its events carry, and whether the
    runner had accepted the plan (which decides how the reservation is undone)."""

    verdict: Verdict
    message: str
    accepted: bool

    @staticmethod
    def of(step_id: int, exc: Exception, *, accepted: bool) -> StepFailure:
        """The failure ladder: what an exception from the runner means."""
        if isinstance(exc, RunnerDeadError):
            return StepFailure(Verdict.DEAD, f"runner died: {exc}", accepted)
        if isinstance(exc, RetryableRunnerError) and not accepted:
            return StepFailure(Verdict.RETRY, f"runner refused step {step_id}: {exc}", False)
        return StepFailure(
            Verdict.QUARANTINE, f"runner failed at step {step_id}: {exc!r}", accepted
        )


@dataclass(slots=True)
class _StepStats:
    """What one commit adds to the metrics."""

    generated: int = 0
    first_prompt: int = 0
    itl: list[float] = field(default_factory=list)
    ttft: list[float] = field(default_factory=list)


class Transaction:
    """Executes plans against one runner; commits and undoes pages through the `Scheduler`
    (the cache's one owner); reports requests that end to `sink`. It holds no per-step state
    between calls."""

    def __init__(
        self,
        runner: Runner,
        scheduler: Scheduler,
        sink: OutcomeSink,
        *,
        max_retries: int,
        vocab_size: int | None,
        collector: MetricsCollector | None,
    ) -> None:
        self._runner = runner
        self._scheduler = scheduler
        self._slot_store = scheduler.slot_store
        self._sink = sink
        self._max_retries = max_retries
        self._vocab_size = vocab_size
        self._collector = collector
        self._async = not callable(getattr(runner, "forward", None)) and isinstance(
            runner, AsyncRunner
        )

    def execute(
        self,
        plan: BatchPlan,
        requests: tuple[Request, ...],
        reservation: PageReservation,
        events: list[Event],
    ) -> None:
        """The synchronous step: run the plan, then commit it or apply the failure policy."""
        out = self._run(plan)
        failure: StepFailure | None
        if isinstance(out, StepFailure):
            failure = out
        else:
            failure = self.check(plan, out)
            if failure is None:
                self.commit(plan, out, requests, reservation, events)
                return
        self.undo(reservation, failure)
        self.fail(failure, requests, events)

    def _run(self, plan: BatchPlan) -> ForwardOutput | StepFailure:
        runner = self._runner
        if not self._async:
            try:
                return runner.forward(plan)
            except Exception as exc:  # refused (retryable) or dead: nothing was accepted
                refused = isinstance(exc, RetryableRunnerError | RunnerDeadError)
                return StepFailure.of(plan.step_id, exc, accepted=not refused)
        assert isinstance(runner, AsyncRunner)
        try:
            runner.submit(plan)
        except Exception as exc:
            return StepFailure.of(plan.step_id, exc, accepted=False)
        try:
            return runner.collect()
        except Exception as exc:
            return StepFailure.of(plan.step_id, exc, accepted=True)

    def check(self, plan: BatchPlan, out: ForwardOutput) -> StepFailure | None:
        """None when `out` is a valid answer to `plan`, else the quarantine it calls for."""
        problem = validate_output(plan, out, self._vocab_size)
        if problem is None:
            return None
        message = f"invalid runner output at step {plan.step_id}: {problem}"
        return StepFailure(Verdict.QUARANTINE, message, accepted=True)

    # -- the failure policy -----------------------------------------------------------------
    def undo(self, reservation: PageReservation, failure: StepFailure) -> None:
        """Return a failed step's reservation: rolled back exactly when the runner never had
        the plan, else abandoned (its pages are freed with the requests' slots)."""
        if failure.accepted:
            self._scheduler.abandon(reservation)
        else:
            self._scheduler.rollback(reservation)

    def fail(
        self, failure: StepFailure, requests: tuple[Request, ...], events: list[Event]
    ) -> None:
        """The requests of a failed step: retried (bounded), quarantined, or, with a dead
        runner, every live request ends. Empty `requests` (all left meanwhile): nothing."""
        if failure.verdict is Verdict.DEAD:
            self._sink.die(failure.message, events)
        elif not requests:
            return
        elif failure.verdict is Verdict.RETRY:
            self._retry(requests, failure.message, events)
        else:
            self._quarantine(requests, failure.message, events)

    def _retry(self, requests: tuple[Request, ...], message: str, events: list[Event]) -> None:
        again: list[Request] = []
        failed: list[Request] = []
        for r in requests:
            r.retries += 1
            (failed if r.retries > self._max_retries else again).append(r)
        if again:
            events.append(ErrorEvent(message, tuple(r.id for r in again), retryable=True))
        if failed:
            final = f"{message} (gave up after {self._max_retries} retries)"
            events.append(ErrorEvent(final, tuple(r.id for r in failed), retryable=False))
            for r in failed:
                events.append(self._sink.finish(r, FinishReason.ERROR, final, cacheable=False))

    def _quarantine(self, requests: tuple[Request, ...], message: str, events: list[Event]) -> None:
        events.append(ErrorEvent(message, tuple(r.id for r in requests), retryable=False))
        for r in requests:
            events.append(self._sink.finish(r, FinishReason.ERROR, message, cacheable=False))

    # -- the commit -------------------------------------------------------------------------
    def commit(
        self,
        plan: BatchPlan,
        out: ForwardOutput,
        requests: tuple[Request, ...],
        reservation: PageReservation,
        events: list[Event],
    ) -> None:
        """The step is valid: the cache and slot store take it, then tokens, events, metrics."""
        if plan.draft_ids.size:  # a verify step (engine/speculative.py)
            finish, collector = self._sink.finish, self._collector
            generated, itl = commit_drafts(
                plan, out, requests, reservation, events, self._scheduler, finish, collector
            )
            if self._collector is not None:
                self._record(plan, out, _StepStats(generated, itl=itl))
            return
        totals = plan.total_lens
        prefill = plan.phase is Phase.PREFILL
        self._scheduler.commit(requests, reservation, totals)
        ids = np.asarray(out.token_ids).astype(np.int32)
        slots = reservation.slots
        ends = self._slot_store.append(slots[plan.sample_rows] if prefill else slots, ids)
        stats = self._append(plan, out, requests, ids, ends, events)
        if self._collector is not None:
            self._record(plan, out, stats)

    def _append(
        self,
        plan: BatchPlan,
        out: ForwardOutput,
        requests: tuple[Request, ...],
        ids: I32,
        ends: dict[int, FinishReason],
        events: list[Event],
    ) -> _StepStats:
        """Append each sampled token to its request, emit its event, end or advance it."""
        decode = plan.phase is Phase.DECODE
        sample = plan.sample_rows
        toks = ids.tolist()
        now = time.monotonic()
        plain = out.logprobs is None and not plan.prompt_logprob_rows.any()
        if decode and plain and all(map(_STARTED, requests)):
            return self._append_decode(requests, toks, ends, now, events)
        stats = _StepStats()
        k = 0
        for i, r in enumerate(requests):
            r.retries = 0
            if not decode:
                if plan.prompt_logprob_rows[i] and r.prompt_lp is not None:
                    k_top = r.sampling_params.prompt_logprobs or 0
                    collect_prompt_logprobs(r.prompt_lp, k_top, plan, out, i)
                if not sample[i]:
                    continue
            tok = toks[k]
            r.append_output(tok)
            times = r.times
            if plain and r.started:
                events.append(TokensEvent(r.id, (tok,), None, None, None, None, r.cached_tokens))
                stats.itl.append(now - times.last_token)
            else:
                if times.first_token == 0.0:
                    times.first_token = now
                    stats.first_prompt += r.num_prompt_tokens
                    stats.ttft.append(now - times.arrival)
                else:
                    stats.itl.append(now - times.last_token)
                events.append(self._tokens_event(r, tok, out, k))
            times.last_token = now
            reason = ends.get(k)
            if reason is not None:
                events.append(self._sink.finish(r, reason))
            elif not decode:
                self._scheduler.prefill_done(r)
            k += 1
        stats.generated = k
        return stats

    def _append_decode(
        self,
        requests: tuple[Request, ...],
        toks: list[int],
        ends: dict[int, FinishReason],
        now: float,
        events: list[Event],
    ) -> _StepStats:
        """`_append` for a decode step of started requests without logprobs (the common
        step), over the whole batch at once: the same appends, events (in the same order) and
        statistics, with no Python loop per row except the requests that end."""
        if any(map(_RETRIES, requests)):
            for r in requests:
                r.retries = 0
        deque(map(list.append, map(_OUTPUT, requests), toks), maxlen=0)
        n = len(requests)
        tokens = token_events(map(_ID, requests), toks, map(_CACHED, requests), n)
        itl = (now - np.fromiter(map(_LAST, requests), np.float64, n)).tolist()
        deque(map(setattr, map(_TIMES, requests), repeat("last_token"), repeat(now)), maxlen=0)
        if not ends:
            events.extend(tokens)
        else:  # each FinishedEvent right after its request's TokensEvent
            lo = 0
            for k in sorted(ends):
                events.extend(tokens[lo : k + 1])
                events.append(self._sink.finish(requests[k], ends[k]))
                lo = k + 1
            events.extend(tokens[lo:])
        return _StepStats(n, itl=itl)

    def _record(self, plan: BatchPlan, out: ForwardOutput, stats: _StepStats) -> None:
        c = self._collector
        assert c is not None
        with c.lock:
            c.num_steps += 1
            c.generation_tokens += stats.generated
            c.prompt_tokens += stats.first_prompt
            c.iteration_tokens.observe(float(plan.num_tokens))
            if stats.itl:
                c.itl.observe_many(np.asarray(stats.itl))
            if stats.ttft:
                c.ttft.observe_many(np.asarray(stats.ttft))
            if out.observations:
                c.observe_runner(out.observations)

    def _tokens_event(self, r: Request, tok: int, out: ForwardOutput, k: int) -> TokensEvent:
        lps = tops = None
        want = r.sampling_params.logprobs
        if want is not None and out.logprobs is not None:
            lps, tops = token_logprobs(out, k, want)
        if r.started:
            return TokensEvent(r.id, (tok,), lps, tops, cached_tokens=r.cached_tokens)
        r.started = True
        plp = ptop = None
        if r.prompt_lp is not None:
            plp = tuple(r.prompt_lp.values)
            ptop = tuple(r.prompt_lp.top) if r.prompt_lp.top else None
        return TokensEvent(r.id, (tok,), lps, tops, plp, ptop, r.cached_tokens)
