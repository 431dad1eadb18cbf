"""The headless Engine: submit requests, `step()` one transaction at a time, read events.

```python
with Engine(runner, context_length=32768, prefix_cache=True) as engine:
    request = engine.submit([1, 6, 24131], sampling_params=SamplingParams(max_output_tokens=8))
    while engine.has_work():
        for event in engine.step():
            print(event)
    generated_ids = request.take_result()
```

One step is one transaction: schedule -> reserve pages -> plan -> run -> validate -> commit.
A `RetryableRunnerError` rolls the reservation back (bounded retries per request); any other
runner failure or an invalid output quarantines exactly that plan's requests; a
`RunnerDeadError` ends every request with an error and the engine refuses new work.
One thread drives an Engine; only `metrics` may be read from other threads.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from types import TracebackType

from resin.cache.manager import CacheManager
from resin.cache.pool import OutOfPagesError
from resin.engine.config import EngineConfig, resolve_layout, validate_prompt
from resin.engine.constraints import ConstraintSet
from resin.engine.grammar import GrammarBackend
from resin.engine.planning import SlotArrays, build_plan
from resin.engine.request import Request, Status
from resin.engine.scheduler import Cohort, Scheduler, SchedulerConfig
from resin.engine.transaction import Transaction
from resin.errors import EngineDeadError
from resin.events import ErrorEvent, Event, FinishedEvent, FinishReason
from resin.metrics.collector import MetricsCollector, MetricsSnapshot
from resin.params import SamplingParams
from resin.plan import Phase
from resin.protocols import AsyncRunner, BindableRunner, ClosableRunner, Runner, RunnerConfig


class Engine:
    """Schedules requests over one paged cache and drives a `Runner` (see module docstring)."""

    def __init__(
        self,
        runner: Runner,
        *,
        context_length: int = 32768,
        prefix_cache: bool = False,
        max_batch_tokens: int = 8192,
        max_sequences: int = 256,
        prefill_chunk_tokens: int = 2048,
        enable_metrics: bool = True,
        max_retries: int = 3,
        grammar: GrammarBackend | None = None,
    ) -> None:
        self.config = EngineConfig(
            context_length=context_length,
            prefix_cache=prefix_cache,
            max_batch_tokens=max_batch_tokens,
            max_sequences=max_sequences,
            prefill_chunk_tokens=prefill_chunk_tokens,
            enable_metrics=enable_metrics,
            max_retries=max_retries,
        )
        if not callable(getattr(runner, "forward", None)) and not isinstance(runner, AsyncRunner):
            raise TypeError("a runner needs forward(plan), or submit(plan) and collect()")
        self.runner = runner
        rc = getattr(runner, "runner_config", None)
        self.runner_config: RunnerConfig = rc if isinstance(rc, RunnerConfig) else RunnerConfig()
        self.layout = resolve_layout(self.runner_config, self.config)
        max_pages = -(-(context_length + 1) // self.layout.page_size)
        self.cache = CacheManager(self.layout, max_sequences, max_pages, prefix_cache=prefix_cache)
        self._slots = SlotArrays(max_sequences)
        self.scheduler = Scheduler(
            SchedulerConfig(max_batch_tokens, max_sequences, prefill_chunk_tokens),
            self.cache,
            self._slots,
        )
        self._collector = MetricsCollector() if enable_metrics else None
        self._constraints = ConstraintSet(
            grammar, self.runner_config.vocab_size, self.runner_config.waits_for_masks
        )
        self._txn = Transaction(self)
        self._live: dict[int, Request] = {}
        self._pending: list[Event] = []
        self._next_id = 0
        self._arrivals = 0
        self._step_id = 0
        self._dead: str | None = None
        self._closed = False
        if isinstance(runner, BindableRunner):
            runner.bind(self.layout)

    # -- public API -----------------------------------------------------------------------
    @property
    def context_length(self) -> int:
        return self.config.context_length

    @property
    def num_waiting(self) -> int:
        return len(self.scheduler.waiting)

    @property
    def num_running(self) -> int:
        return self.scheduler.num_admitted

    @property
    def metrics(self) -> MetricsSnapshot | None:
        """A consistent snapshot (safe from any thread); None with `enable_metrics=False`."""
        return None if self._collector is None else self._collector.snapshot()

    @property
    def dead(self) -> bool:
        return self._dead is not None or self._closed

    def submit(
        self,
        prompt_token_ids: Sequence[int],
        sampling_params: SamplingParams | None = None,
        request_id: int | None = None,
    ) -> Request:
        """Validate and queue a request. Bad input raises `ValueError` and queues nothing."""
        if self.dead:
            raise EngineDeadError(self._dead or "the engine is closed")
        params = SamplingParams() if sampling_params is None else sampling_params
        if not isinstance(params, SamplingParams):
            raise ValueError("sampling_params must be a SamplingParams")
        prompt = validate_prompt(prompt_token_ids, self.runner_config, self.config)
        if params.logprobs is not None and params.logprobs > self.runner_config.max_logprobs:
            raise ValueError(f"logprobs must be <= {self.runner_config.max_logprobs}")
        need = self.cache.pages_per_sequence(len(prompt) + 1, self.config.prefill_chunk_tokens)
        if need > self.layout.num_pages:
            raise ValueError(
                f"a prompt of {len(prompt)} tokens needs {need} cache pages, "
                f"the cache has {self.layout.num_pages}"
            )
        grammar = self._constraints.check(params)
        rid = self._take_id(request_id)
        request = Request(rid, prompt, params)
        self._constraints.admit(request, grammar)
        request._arrival = self._arrivals
        self._arrivals += 1
        request._times.arrival = time.monotonic()
        self._live[rid] = request
        self.scheduler.add(request)
        return request

    def has_work(self) -> bool:
        return bool(self._pending) or (self._dead is None and self.scheduler.has_work())

    def step(self) -> list[Event]:
        """Run one transaction; return its events (and any from aborts since the last step)."""
        events, self._pending = self._pending, []
        if self._dead is not None or not self.scheduler.has_work():
            if self._dead is None:
                self._update_gauges()  # aborts since the last step changed the counts
            return events
        preemptions = self.scheduler.num_preemptions
        cohort = self.scheduler.schedule()
        if cohort is None:
            if self.scheduler.num_preemptions == preemptions:
                self._fail_unfittable(events)
        else:
            self._step_id += 1
            self._run(cohort, events)
        self._update_gauges()
        return events

    def abort(self, request: Request | int) -> None:
        """End a request in any state; its `FinishedEvent(abort)` comes with the next step.

        Aborting a finished or unknown request is a no-op."""
        rid = request.id if isinstance(request, Request) else int(request)
        live = self._live.get(rid)
        if live is None:
            return
        self._pending.append(self.finish(live, FinishReason.ABORT))

    def close(self) -> None:
        """Abort everything, close the runner; `submit` raises from now on. Idempotent."""
        if self._closed:
            return
        for request in list(self._live.values()):
            self._pending.append(self.finish(request, FinishReason.ABORT))
        self._closed = True
        self._constraints.close()
        if isinstance(self.runner, ClosableRunner):
            self.runner.close()

    def check_invariants(self) -> None:
        """Cache refcounts match what live requests (and the prefix trie) hold."""
        self.cache.check_invariants([r._slot for r in self.scheduler.admitted()])
        for r in self._live.values():
            assert r._status is not Status.FINISHED
        assert len(self._live) == (len(self.scheduler.waiting) + self.scheduler.num_admitted), (
            "a live request is in no queue"
        )

    def __enter__(self) -> Engine:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    # -- one step -------------------------------------------------------------------------
    def _run(self, cohort: Cohort, events: list[Event]) -> None:
        prefill = cohort.phase is Phase.PREFILL
        try:
            reservation = self.cache.reserve(cohort.slots, cohort.cached, cohort.totals, prefill)
        except OutOfPagesError:
            # The scheduler's estimate was short (a bug, but not worth a crash): make room
            # the usual way and try again next step.
            self.scheduler.retract(self.scheduler.youngest())
            return
        plan = build_plan(
            self._step_id,
            cohort.phase,
            cohort.requests,
            reservation,
            cohort.cached,
            cohort.totals,
            self._slots,
            self.cache,
        )
        if self._constraints.active:
            plan = self._constraints.attach(plan, cohort.requests)
        self._txn.execute(plan, cohort.requests, reservation, events)
        if self._constraints.active:
            self._constraints.advance(cohort.requests, events, self._finish_constrained)

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
        self.scheduler.finish(request, cacheable=cacheable)
        self._constraints.release(request)
        self._live.pop(request.id, None)
        request.finish_reason = reason
        request.error = error
        if self._collector is not None:
            self._record_finish(request, reason)
        return FinishedEvent(
            request.id,
            reason,
            request.num_prompt_tokens,
            len(request.output_token_ids),
            request.cached_tokens,
            error,
        )

    def _finish_constrained(
        self, request: Request, reason: FinishReason, error: str | None
    ) -> FinishedEvent:
        return self.finish(request, reason, error, cacheable=reason is not FinishReason.ERROR)

    def die(self, message: str, events: list[Event]) -> None:
        """The runner is gone: every live request ends with an error; `submit` raises."""
        self._dead = message
        ids = tuple(self._live)
        events.append(ErrorEvent(message, ids, retryable=False))
        for request in list(self._live.values()):
            events.append(self.finish(request, FinishReason.ERROR, message))

    def _fail_unfittable(self, events: list[Event]) -> None:
        # Nothing runs and nothing is admitted: the head request cannot fit the cache even
        # alone (it outgrew it while decoding). End it rather than spin.
        if self.scheduler.num_admitted or not self.scheduler.waiting:
            return
        head = self.scheduler.waiting[0]
        message = (
            f"request {head.id} needs more cache pages than the engine has "
            f"({self.layout.num_pages}); it cannot continue"
        )
        events.append(self.finish(head, FinishReason.ERROR, message))

    def _take_id(self, request_id: int | None) -> int:
        if request_id is None:
            while self._next_id in self._live:
                self._next_id += 1
            rid = self._next_id
            self._next_id += 1
            return rid
        if isinstance(request_id, bool) or not isinstance(request_id, int):
            raise ValueError("request_id must be an int")
        if request_id in self._live:
            raise ValueError(f"request id {request_id} is already in use")
        return request_id

    # -- metrics --------------------------------------------------------------------------
    def _update_gauges(self) -> None:
        c = self._collector
        if c is None:
            return
        with c.lock:
            c.running = self.scheduler.num_admitted
            c.waiting = len(self.scheduler.waiting)
            c.cache_usage = self.cache.usage()
            c.preemptions = self.scheduler.num_preemptions
            c.prefix_queries = self.cache.prefix_queries
            c.prefix_hits = self.cache.prefix_hits

    def _record_finish(self, request: Request, reason: FinishReason) -> None:
        c = self._collector
        assert c is not None
        t = request._times
        now = time.monotonic()
        with c.lock:
            c.success[reason.value] += 1
            c.e2e.observe(now - t.arrival)
            if t.admitted:
                c.queue_time.observe(t.admitted - t.arrival)
            if t.first_token:
                c.prefill_time.observe(t.first_token - t.admitted)
                c.decode_time.observe(max(0.0, t.last_token - t.first_token))

    @property
    def collector(self) -> MetricsCollector | None:
        return self._collector

    @property
    def slot_arrays(self) -> SlotArrays:
        return self._slots
