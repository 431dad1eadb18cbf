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
With an overlapping `AsyncRunner` (`overlap`), pure decode steps (constrained ones too) are
pipelined: plan n+1 is submitted before step n is collected (`engine/pipeline.py`).
One thread drives an Engine; other threads may only read `metrics` and call `cached_prefix`
(a lock-free trie walk: a hint that may be a step stale, for routing between replicas).
"""

from __future__ import annotations

import time
from collections.abc import Sequence

from resin.cache.manager import CacheManager, PageReservation
from resin.cache.pool import OutOfPagesError
from resin.engine.constraints import ConstraintSet
from resin.engine.engine_config import EngineConfig, resolve_layout, validate_prompt
from resin.engine.grammar import GrammarBackend
from resin.engine.lifecycle import Lifecycle
from resin.engine.media import prompt_keys, validate_media
from resin.engine.pipeline import Pipeline, make_pipeline
from resin.engine.planning import build_plan
from resin.engine.request import Request, Status
from resin.engine.scheduler import Cohort, Scheduler, SchedulerConfig
from resin.engine.slots import SlotStore
from resin.engine.speculative import DraftStep, Speculation, Speculator
from resin.engine.transaction import Transaction
from resin.errors import EngineDeadError
from resin.events import Event, FinishedEvent, FinishReason
from resin.metrics.collector import MetricsCollector, MetricsSnapshot
from resin.params import SamplingParams
from resin.plan import BatchPlan, MediaItem, Phase
from resin.protocols import (
    AsyncRunner,
    BindableRunner,
    CacheLayout,
    ClosableRunner,
    Runner,
    RunnerConfig,
)


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
        overlap: bool | None = None,
        speculation: Speculation | None = None,
    ) -> None:
        self._config = EngineConfig(
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
        self._runner = runner
        rc = getattr(runner, "runner_config", None)
        self._runner_config = rc if isinstance(rc, RunnerConfig) else RunnerConfig()
        self._layout = resolve_layout(self._runner_config, self._config)
        max_pages = self._config.pages_per_sequence(self._layout.page_size)
        self._cache = CacheManager(
            self._layout, max_sequences, max_pages, prefix_cache=prefix_cache
        )
        self._slots = SlotStore(max_sequences, context_length)
        self._scheduler = Scheduler(
            SchedulerConfig(max_batch_tokens, max_sequences, prefill_chunk_tokens),
            self._cache,
            self._slots,
        )
        self._collector = MetricsCollector() if enable_metrics else None
        self._constraints = ConstraintSet(
            grammar, self._runner_config.vocab_size, self._runner_config.waits_for_masks
        )
        self.grammar = grammar  # read-only: None means a constraint is refused at submit
        self._life = Lifecycle(self._scheduler, self._collector, self._constraints.release)
        self._txn = Transaction(
            runner,
            self._cache,
            self._scheduler,
            self._slots,
            self._life,
            max_retries=max_retries,
            vocab_size=self._runner_config.vocab_size,
            collector=self._collector,
        )
        self._pipe = make_pipeline(overlap, runner, self._runner_config, self._txn, self._cache,
                                   self._slots, self._life, self._constraints)  # fmt: skip
        self._spec = (
            None
            if speculation is None
            else Speculator(speculation, self._runner_config, max_batch_tokens, self._collector)
        )
        self._pending: list[Event] = []
        self._step_id = 0
        self._closed = False
        if isinstance(runner, BindableRunner):
            runner.bind(self._layout)

    # -- public API -----------------------------------------------------------------------
    @property
    def runner_config(self) -> RunnerConfig:
        """What the runner declared (a default `RunnerConfig()` when it declares nothing)."""
        return self._runner_config

    @property
    def layout(self) -> CacheLayout:
        """The one arena the runner was bound to."""
        return self._layout

    @property
    def overlap(self) -> bool:
        """Whether decode steps are pipelined (submit n+1 before collecting n)."""
        return self._pipe is not None

    @property
    def context_length(self) -> int:
        return self._config.context_length

    @property
    def num_waiting(self) -> int:
        return len(self._scheduler.waiting)

    @property
    def num_running(self) -> int:
        return self._scheduler.num_admitted

    @property
    def metrics(self) -> MetricsSnapshot | None:
        """A consistent snapshot (safe from any thread); None with `enable_metrics=False`."""
        return None if self._collector is None else self._collector.snapshot()

    @property
    def dead(self) -> bool:
        return self._life.dead is not None or self._closed

    def submit(
        self,
        prompt_token_ids: Sequence[int],
        sampling_params: SamplingParams | None = None,
        request_id: int | None = None,
        media: Sequence[MediaItem] = (),
    ) -> Request:
        """Validate and queue a request (`media`: its images, docs/vision.md); bad input raises
        `ValueError` and queues nothing."""
        if self.dead:
            raise EngineDeadError(self._life.dead or "the engine is closed")
        params = SamplingParams() if sampling_params is None else sampling_params
        if not isinstance(params, SamplingParams):
            raise ValueError("sampling_params must be a SamplingParams")
        prompt = validate_prompt(prompt_token_ids, self._runner_config, self._config)
        self._runner_config.check_request(params, bool(media))
        if params.logprobs is not None and params.logprobs > self._runner_config.max_logprobs:
            raise ValueError(f"logprobs must be <= {self._runner_config.max_logprobs}")
        need = self._cache.pages_per_sequence(len(prompt) + 1, self._config.prefill_chunk_tokens)
        if need > self._layout.num_pages:
            raise ValueError(
                f"a prompt of {len(prompt)} tokens needs {need} cache pages, "
                f"the cache has {self._layout.num_pages}"
            )
        grammar = self._constraints.check(params)
        rid = self._life.take_id(request_id)
        items = validate_media(media, len(prompt), self._config.prefill_chunk_tokens)
        request = Request(rid, prompt, params, items)
        request.times.arrival = time.monotonic()
        self._constraints.admit(request, grammar)
        self._life.add(request)
        self._scheduler.add(request)
        return request

    def cached_prefix(self, prompt: Sequence[int], media: Sequence[MediaItem] = ()) -> int:
        """Prompt tokens the prefix cache holds now (0 without one): read-only, a routing hint."""
        return self._cache.match(prompt_keys(prompt, media)).tokens

    def has_work(self) -> bool:
        busy = self._pipe is not None and self._pipe.busy
        return bool(self._pending) or (
            self._life.dead is None and (busy or self._scheduler.has_work())
        )

    def step(self) -> list[Event]:
        """Run one transaction; return its events (and any from aborts since the last step)."""
        events, self._pending = self._pending, []
        if self._life.dead is not None or not self._scheduler.has_work():
            if self._pipe is not None:  # rows of requests that ended while in flight
                self._pipe.drain(events)
            if self._life.dead is None:
                self._update_gauges()  # aborts since the last step changed the counts
            return events
        preemptions = self._scheduler.num_preemptions
        cohort = self._scheduler.schedule()
        if cohort is None:
            if self._pipe is not None:
                self._pipe.drain(events)
            if self._scheduler.num_preemptions == preemptions:
                self._fail_unfittable(events)
        else:
            self._step_id += 1
            if self._pipe is None:
                self._run(cohort, events)
            else:
                self._overlapped(self._pipe, cohort, events)
        self._update_gauges()
        return events

    def abort(self, request: Request | int) -> None:
        """End a request in any state; its `FinishedEvent(abort)` comes with the next step.

        Aborting a finished or unknown request is a no-op."""
        rid = request.id if isinstance(request, Request) else int(request)
        live = self._life.live.get(rid)
        if live is None:
            return
        self._pending.append(self._life.finish(live, FinishReason.ABORT))

    def close(self) -> None:
        """Abort everything, close the runner; `submit` raises from now on. Idempotent."""
        if self._closed:
            return
        if self._pipe is not None:  # the device finishes what it was given
            self._pipe.drain(self._pending)
        for request in list(self._life.live.values()):
            self._pending.append(self._life.finish(request, FinishReason.ABORT))
        self._closed = True
        self._constraints.close()
        if isinstance(self._runner, ClosableRunner):
            self._runner.close()

    def check_invariants(self) -> None:
        """Cache refcounts match what live requests (and the prefix trie) hold."""
        self._cache.check_invariants([r.slot for r in self._scheduler.admitted()])
        live = self._life.live
        for r in live.values():
            assert r.status is not Status.FINISHED
        queued = len(self._scheduler.waiting) + self._scheduler.num_admitted
        assert len(live) == queued, "a live request is in no queue"

    def __enter__(self) -> Engine:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    # -- one step -------------------------------------------------------------------------
    def _run(self, cohort: Cohort, events: list[Event]) -> None:
        reserved = self._reserve(cohort)
        if reserved is None:
            return
        plan, reservation, cohort = reserved
        if self._constraints.active:
            plan = self._constraints.attach(plan, cohort.requests)
        self._txn.execute(plan, cohort.requests, reservation, events)
        if self._constraints.active:
            self._constraints.advance(cohort.requests, events, self._finish_constrained)

    def _reserve(
        self, cohort: Cohort, chained: Pipeline | None = None
    ) -> tuple[BatchPlan, PageReservation, Cohort] | None:
        prefill = cohort.phase is Phase.PREFILL
        drafts: DraftStep | None = None
        if self._spec is not None and not prefill:
            drafts = self._spec.extend(cohort, self._cache, self._slots)
            cohort = cohort if drafts is None else drafts.cohort
        try:
            reservation = self._cache.reserve(cohort.slots, cohort.cached, cohort.totals, prefill)
        except OutOfPagesError:
            # The scheduler's estimate was short (a bug, but not worth a crash): make room
            # the usual way and try again next step.
            self._scheduler.retract(self._scheduler.youngest())
            return None
        if drafts is None:
            prev = None if chained is None else chained.chained(reservation.slots)
            plan = build_plan(self._step_id, cohort, reservation, self._slots, self._cache, prev)
        else:
            plan = drafts.plan(self._step_id, reservation, self._slots, self._cache)
        return plan, reservation, cohort

    def _overlapped(self, pipe: Pipeline, cohort: Cohort, events: list[Event]) -> None:
        """Pipeline pure decode steps; drain before prefill, drafts, or constrained rows
        a runner cannot wait masks for."""
        if cohort.phase is Phase.PREFILL or self._constraints.drains or self._spec is not None:
            if pipe.busy:
                pipe.drain(events)
                if cohort.phase is Phase.DECODE or self._life.dead is not None:
                    return  # planned on in-flight rows that may have ended: schedule afresh
            self._run(cohort, events)
            return
        reserved = self._reserve(cohort, pipe)
        if reserved is not None:
            plan, reservation, cohort = reserved
            pipe.launch(pipe.chain_states(plan), cohort.requests, reservation, events)
        pipe.settle(events)

    def _finish_constrained(
        self, request: Request, reason: FinishReason, error: str | None
    ) -> FinishedEvent:
        return self._life.finish(request, reason, error, cacheable=reason is not FinishReason.ERROR)

    def _fail_unfittable(self, events: list[Event]) -> None:
        # Nothing runs and nothing is admitted: the head request cannot fit the cache even
        # alone (it outgrew it while decoding). End it rather than spin.
        if self._scheduler.num_admitted or not self._scheduler.waiting:
            return
        head = self._scheduler.waiting[0]
        message = (
            f"request {head.id} needs more cache pages than the engine has "
            f"({self._layout.num_pages}); it cannot continue"
        )
        events.append(self._life.finish(head, FinishReason.ERROR, message))

    def _update_gauges(self) -> None:
        c = self._collector
        if c is None:
            return
        with c.lock:
            c.running = self._scheduler.num_admitted
            c.waiting = len(self._scheduler.waiting)
            c.cache_usage = self._cache.usage()  # live requests' pages only
            c.prefix_cache_usage = self._cache.prefix_usage()  # evictable cached pages
            c.preemptions = self._scheduler.num_preemptions
            c.prefix_queries = self._cache.prefix_queries
            c.prefix_hits = self._cache.prefix_hits
