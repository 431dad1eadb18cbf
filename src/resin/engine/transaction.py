"""One step's transaction: run the plan, then commit, retry or quarantine.

reserve (done by the engine) -> runner -> validate -> commit. Outcomes:
- `RetryableRunnerError` before acceptance: roll the reservation back; the requests stay where
  they were and run again; after `max_retries` consecutive failures a request ends with `error`.
- `RunnerDeadError`: the engine dies (every request ends with `error`).
- any other exception after acceptance, or an invalid output: the plan's requests are
  quarantined (end with `error`, pages freed, never cached); other requests go on.
"""

from __future__ import annotations

import time
from typing import Protocol

import numpy as np

from resin.cache.manager import CacheManager, Reservation
from resin.engine.outputs import collect_prompt_logprobs, token_logprobs
from resin.engine.planning import SlotArrays
from resin.engine.request import Request
from resin.engine.scheduler import Scheduler
from resin.engine.validate import validate_output
from resin.errors import RetryableRunnerError, RunnerDeadError
from resin.events import ErrorEvent, Event, FinishedEvent, FinishReason, TokensEvent
from resin.metrics.collector import MetricsCollector
from resin.plan import BatchPlan, ForwardOutput, Phase
from resin.protocols import AsyncRunner, Runner


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


class _Retry(Exception):
    def __init__(self, cause: BaseException) -> None:
        self.cause = cause


class Transaction:
    """Executes plans against one runner, cache, scheduler and slot store; reports requests
    that end to `sink`. It holds no per-step state between calls."""

    def __init__(
        self,
        runner: Runner,
        cache: CacheManager,
        scheduler: Scheduler,
        slots: SlotArrays,
        sink: OutcomeSink,
        *,
        context_length: int,
        max_retries: int,
        vocab_size: int | None,
        collector: MetricsCollector | None,
    ) -> None:
        self._runner = runner
        self._cache = cache
        self._scheduler = scheduler
        self._slots = slots
        self._sink = sink
        self._context_length = context_length
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
        reservation: Reservation,
        events: list[Event],
    ) -> None:
        try:
            out = self._call(plan)
        except _Retry as exc:
            self._cache.rollback(reservation)
            self._retry(requests, f"runner refused step {plan.step_id}: {exc.cause}", events)
            return
        except RunnerDeadError as exc:
            self._cache.rollback(reservation)
            self._sink.die(f"runner died: {exc}", events)
            return
        except Exception as exc:  # post-accept failure: only this plan's requests are affected
            self._cache.abandon(reservation)
            self._quarantine(requests, f"runner failed at step {plan.step_id}: {exc!r}", events)
            return
        problem = validate_output(plan, out, self._vocab_size)
        if problem is not None:
            self._cache.abandon(reservation)
            self._quarantine(
                requests, f"invalid runner output at step {plan.step_id}: {problem}", events
            )
            return
        self._commit(plan, out, requests, reservation, events)

    def _call(self, plan: BatchPlan) -> ForwardOutput:
        runner = self._runner
        if self._async:
            assert isinstance(runner, AsyncRunner)
            try:
                runner.submit(plan)
            except RetryableRunnerError as exc:
                raise _Retry(exc) from exc
            return runner.collect()
        try:
            return runner.forward(plan)
        except RetryableRunnerError as exc:
            raise _Retry(exc) from exc

    # -- outcomes ---------------------------------------------------------------------------
    def _retry(self, requests: tuple[Request, ...], message: str, events: list[Event]) -> None:
        again: list[Request] = []
        failed: list[Request] = []
        for r in requests:
            r._retries += 1
            (failed if r._retries > self._max_retries else again).append(r)
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

    def _commit(
        self,
        plan: BatchPlan,
        out: ForwardOutput,
        requests: tuple[Request, ...],
        reservation: Reservation,
        events: list[Event],
    ) -> None:
        arrays = self._slots
        slots, totals = reservation.slots, plan.total_lens
        self._cache.commit(reservation, totals, requests)
        arrays.num_computed[slots] = totals
        decode = plan.phase is Phase.DECODE
        sample = plan.sample_rows
        ids = np.asarray(out.token_ids).astype(np.int32)
        sampled = slots if decode else slots[sample]
        arrays.last_token[sampled] = ids
        arrays.num_output[sampled] += 1
        # Stop rules, vectorized over sampled rows: `length` ends it whatever the token,
        # a stop token ends it only from `stop_ok_from` outputs on.
        n_out = arrays.num_output[sampled]
        ends = (n_out >= arrays.max_output[sampled]) | (
            (totals if decode else totals[sample]) + 1 >= self._context_length
        )
        stop_ok = (n_out >= arrays.stop_ok_from[sampled]).tolist()
        ends_list = ends.tolist()
        toks = ids.tolist()
        now = time.monotonic()
        collector = self._collector
        itl: list[float] = []
        ttft: list[float] = []
        first_prompt = 0
        plain = out.logprobs is None and not plan.prompt_logprob_rows.any()
        k = 0
        for i, (r, total) in enumerate(zip(requests, totals.tolist(), strict=True)):
            r._num_computed = total
            r._retries = 0
            if not decode:
                if plan.prompt_logprob_rows[i]:
                    collect_prompt_logprobs(r, plan, out, i)
                if not sample[i]:
                    continue
            tok = toks[k]
            r._num_tokens += 1
            r.output_token_ids.append(tok)
            times = r._times
            if plain and r._first_event_sent:
                events.append(TokensEvent(r.id, (tok,), None, None, None, None, r.cached_tokens))
                itl.append(now - times.last_token)
            else:
                if times.first_token == 0.0:
                    times.first_token = now
                    first_prompt += r.num_prompt_tokens
                    ttft.append(now - times.arrival)
                else:
                    itl.append(now - times.last_token)
                events.append(self._tokens_event(r, tok, out, k))
            times.last_token = now
            if stop_ok[k] and tok in r._stops:
                events.append(self._sink.finish(r, FinishReason.STOP))
            elif ends_list[k]:
                events.append(self._sink.finish(r, FinishReason.LENGTH))
            elif not decode:
                self._scheduler.prefill_done(r)
            k += 1
        if collector is not None:
            with collector.lock:
                collector.num_steps += 1
                collector.generation_tokens += k
                collector.prompt_tokens += first_prompt
                collector.iteration_tokens.observe(float(plan.num_tokens))
                if itl:
                    collector.itl.observe_many(np.asarray(itl))
                if ttft:
                    collector.ttft.observe_many(np.asarray(ttft))
                if out.observations:
                    collector.observe_runner(out.observations)

    def _tokens_event(self, r: Request, tok: int, out: ForwardOutput, k: int) -> TokensEvent:
        lps = tops = None
        want = r.sampling_params.logprobs
        if want is not None and out.logprobs is not None:
            lps, tops = token_logprobs(out, k, want)
        if r._first_event_sent:
            return TokensEvent(r.id, (tok,), lps, tops, cached_tokens=r.cached_tokens)
        r._first_event_sent = True
        plp = ptop = None
        if r._want_prompt_logprobs:
            plp = tuple(r._prompt_logprobs)
            ptop = tuple(r._prompt_top) if r._prompt_top else None
        return TokensEvent(r.id, (tok,), lps, tops, plp, ptop, r.cached_tokens)
