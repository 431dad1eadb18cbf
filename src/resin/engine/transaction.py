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
from dataclasses import dataclass, field, replace
from itertools import repeat
from operator import attrgetter
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt

from resin.cache.manager import PageReservation
from resin.engine.constraints import ConstraintSet
from resin.engine.outputs import collect_prompt_logprobs, token_logprobs
from resin.engine.request import Request
from resin.engine.scheduler import Committed, Scheduler
from resin.engine.validate import validate_output
from resin.errors import RetryableRunnerError, RunnerDeadError
from resin.events import (
    ErrorEvent,
    Event,
    FinishedEvent,
    FinishReason,
    TokensEvent,
    TopLogprob,
    plain_tokens_events,
)
from resin.metrics.collector import MetricsCollector
from resin.plan import BatchPlan, ForwardOutput
from resin.protocols import AsyncRunner, Runner

I32 = npt.NDArray[np.int32]

_ID = attrgetter("id")
_CACHED = attrgetter("cached_tokens")
_TIMES = attrgetter("times")
_LAST = attrgetter("times.last_token")
_STARTED = attrgetter("started")


def token_events(
    ids: Iterable[int], tokens: Iterable[int], cached: Iterable[int], n: int
) -> list[TokensEvent]:
    """`[TokensEvent(id, (token,), cached_tokens=c) ...]` for `n` one-token rows
    (`plain_tokens_events`)."""
    return plain_tokens_events(ids, zip(tokens), cached, n)


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

    def finish_constrained(
        self, request: Request, reason: FinishReason, error: str | None
    ) -> FinishedEvent: ...


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
        constraints: ConstraintSet | None = None,
    ) -> None:
        self._runner = runner
        self._scheduler = scheduler
        self._constraints = constraints
        """Whose grammars take each landed step's tokens (`ConstraintSet.advance`)."""
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
        """The synchronous step: run the plan, then land it (`settle`)."""
        self.settle(plan, self._run(plan), requests, reservation, events)

    def settle(
        self,
        plan: BatchPlan,
        result: ForwardOutput | StepFailure,
        requests: tuple[Request, ...],
        reservation: PageReservation,
        events: list[Event],
        keep: npt.NDArray[np.bool_] | None = None,
    ) -> StepFailure | None:
        """The one landing of a step, synchronous or overlapped: validate the output, commit
        it or apply the failure policy, then the step's grammars take what was committed
        (or learn that nothing was). `keep` (overlap): the rows whose request is still the
        one the plan was built for (None: a synchronous step, every row). Returns the
        failure, if any."""
        failure = result if isinstance(result, StepFailure) else self.check(plan, result)
        if failure is not None:
            self.undo(reservation, failure)
            live = requests
            if keep is not None:
                live = tuple(r for r, k in zip(requests, keep.tolist(), strict=True) if k)
            self.fail(failure, live, events)
        elif isinstance(result, ForwardOutput):
            if keep is None or keep.all():
                self.commit(plan, result, requests, reservation, events, landed=keep is not None)
            elif keep.any():
                rows = tuple(requests[i] for i in np.flatnonzero(keep).tolist())
                part = reservation.rows(keep)
                self.commit(rows_of(plan, keep), out_rows(result, keep), rows, part, events,
                            landed=True)  # fmt: skip
        c = self._constraints
        if c is not None and c.hooked:
            c.advance(requests, events, self._sink.finish_constrained)
        return failure

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
        failed = self._scheduler.retried(requests, self._max_retries)
        again = [r for r in requests if r not in failed]
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
        *,
        landed: bool = False,
    ) -> None:
        """The step is valid: the scheduler records it row by row (`Scheduler.commit`: the
        stop rule, the cache, the slot store, the requests' tokens), then each row's events,
        then the metrics. A decode row is a verify row with k = 0 drafts; a step of those
        whose events carry no logprobs takes the batch-wide path (`_decode_events`), the
        common step at hundreds of rows. `landed`: an overlapped plan."""
        done = self._scheduler.commit(requests, reservation, plan, out, landed=landed)
        now = time.monotonic()
        plain = out.logprobs is None and not plan.prompt_logprob_rows.any()
        if done.kept is None and plain and all(map(_STARTED, requests)):
            stats = self._decode_events(requests, done, now, events)
        else:
            stats = self._events(plan, out, requests, done, now, events)
        if self._collector is not None:
            self._record(plan, out, stats)

    def _events(
        self,
        plan: BatchPlan,
        out: ForwardOutput,
        requests: tuple[Request, ...],
        done: Committed,
        now: float,
        events: list[Event],
    ) -> _StepStats:
        """Row by row: prompt logprobs collected, one `TokensEvent` per row with tokens (its
        first carries the prompt logprobs), the request's `FinishedEvent` right after it."""
        stats = _StepStats()
        toks, offsets, kept = done.tokens, done.offsets, done.kept
        for i, r in enumerate(requests):
            if plan.prompt_logprob_rows[i] and r.prompt_lp is not None:
                k_top = r.sampling_params.prompt_logprobs or 0
                collect_prompt_logprobs(r.prompt_lp, k_top, plan, out, i)
            lo, n = (i, 1) if offsets is None or kept is None else (offsets[i], kept[i])
            if not n:
                continue
            times = r.times
            if times.first_token == 0.0:
                times.first_token = now
                stats.first_prompt += r.num_prompt_tokens
                stats.ttft.append(now - times.arrival)
            else:  # the step's gap, spread evenly over its tokens
                stats.itl.extend([(now - times.last_token) / n] * n)
            times.last_token = now
            stats.generated += n
            events.append(self._tokens_event(r, toks[lo : lo + n], out, lo))
            reason = done.ends.get(i)
            if reason is not None:
                events.append(self._sink.finish(r, reason))
        return stats

    def _decode_events(
        self, requests: tuple[Request, ...], done: Committed, now: float, events: list[Event]
    ) -> _StepStats:
        """`_events` for one token per started row without logprobs, over the whole batch at
        once: the same events (in the same order) and statistics, with no Python loop per row
        except the requests that end."""
        n = len(requests)
        tokens = token_events(map(_ID, requests), done.tokens, map(_CACHED, requests), n)
        itl = (now - np.fromiter(map(_LAST, requests), np.float64, n)).tolist()
        deque(map(setattr, map(_TIMES, requests), repeat("last_token"), repeat(now)), maxlen=0)
        ends = done.ends
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
            if plan.draft_ids.size:  # a verify step: how many drafts each drafted row kept
                drafts = np.diff(plan.draft_indptr)
                returned = np.diff(np.asarray(out.token_indptr).astype(np.int64))
                accepted = (returned - 1)[drafts > 0]
                c.spec_drafts += int(accepted.size)
                c.spec_draft_tokens += int(drafts.sum())
                c.spec_accepted_tokens += int(accepted.sum())
                c.acceptance.observe_many(accepted.astype(np.float64))

    def _tokens_event(
        self, r: Request, toks: list[int], out: ForwardOutput, lo: int
    ) -> TokensEvent:
        """Row tokens `toks` (flat output index `lo` on) as the request's event; its first
        event carries the prompt logprobs."""
        lps = tops = None
        want = r.sampling_params.logprobs
        if want is not None and out.logprobs is not None:
            lps, tops = _logprobs(out, lo, len(toks), want)
        if r.started:
            return TokensEvent(r.id, tuple(toks), lps, tops, cached_tokens=r.cached_tokens)
        r.started = True
        plp = ptop = None
        if r.prompt_lp is not None:
            plp = tuple(r.prompt_lp.values)
            ptop = tuple(r.prompt_lp.top) if r.prompt_lp.top else None
        return TokensEvent(r.id, tuple(toks), lps, tops, plp, ptop, r.cached_tokens)


def _logprobs(
    out: ForwardOutput, lo: int, n: int, want: int
) -> tuple[tuple[float, ...], tuple[tuple[TopLogprob, ...], ...] | None]:
    """The logprobs (and top-`want` alternatives) of output tokens `lo .. lo + n - 1`."""
    if n == 1:
        return token_logprobs(out, lo, want)
    pairs = [token_logprobs(out, lo + j, want) for j in range(n)]
    lps = tuple(p[0][0] for p in pairs)
    tops = [p[1][0] for p in pairs if p[1] is not None]
    return lps, tuple(tops) if want > 0 and len(tops) == n else None


def rows_of(plan: BatchPlan, keep: npt.NDArray[np.bool_]) -> BatchPlan:
    """A decode plan (one query token a row) restricted to the kept rows, for the commit."""
    k = int(keep.sum())
    indptr = np.arange(k + 1, dtype=np.int32)
    return replace(
        plan,
        sequence_ids=plan.sequence_ids[keep],
        input_ids=plan.input_ids[keep],
        query_indptr=indptr,
        positions=plan.positions[keep],
        cached_lens=plan.cached_lens[keep],
        total_lens=plan.total_lens[keep],
        sample_rows=plan.sample_rows[keep],
        prompt_logprob_rows=plan.prompt_logprob_rows[keep],
        target_ids=plan.target_ids[keep],
        draft_indptr=np.zeros(k + 1, dtype=np.int32),
        prev_token_rows=plan.prev_token_rows[keep]
        if plan.prev_token_rows.size
        else plan.prev_token_rows,
    )


def out_rows(out: ForwardOutput, keep: npt.NDArray[np.bool_]) -> ForwardOutput:
    """A decode output (one token a row) restricted to the kept rows, proposed drafts too."""
    k = int(keep.sum())

    def pick(a: np.ndarray | None) -> np.ndarray | None:
        return None if a is None else np.asarray(a)[keep]

    drafts: dict[str, Any] = {}
    if out.draft_ids is not None and out.draft_indptr is not None:
        indptr = np.asarray(out.draft_indptr).astype(np.int64)
        per_row = np.diff(indptr)[keep]
        take = np.repeat(keep, np.diff(indptr))
        drafts["draft_ids"] = np.asarray(out.draft_ids)[take]
        drafts["draft_indptr"] = np.concatenate(([0], np.cumsum(per_row))).astype(np.int32)
    return replace(
        out,
        token_ids=np.asarray(out.token_ids)[keep],
        token_indptr=np.arange(k + 1, dtype=np.uint32),
        logprobs=pick(out.logprobs),
        top_ids=pick(out.top_ids),
        top_logprobs=pick(out.top_logprobs),
        **drafts,
    )
