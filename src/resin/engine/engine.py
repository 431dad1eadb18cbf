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

from collections.abc import Sequence

from resin.engine.constraints import ConstraintSet
from resin.engine.engine_config import (
    ArenaReport,
    EngineConfig,
    arena_report,
    check_params,
    resolve_layout,
    validate_prompt,
)
from resin.engine.grammar import GrammarBackend, GrammarState
from resin.engine.lifecycle import Lifecycle
from resin.engine.media import prompt_keys, validate_media
from resin.engine.pipeline import Pipeline, make_pipeline
from resin.engine.planning import build_plan
from resin.engine.request import Request
from resin.engine.scheduler import Cohort, ReservedCohort, Scheduler
from resin.engine.speculative import DraftStep, Speculation, Speculator
from resin.engine.transaction import Transaction
from resin.errors import EngineDeadError
from resin.events import Event, FinishReason
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
        config = self._config = EngineConfig(
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
        self._layout = resolve_layout(self._runner_config, config)
        self._scheduler = Scheduler(config, self._layout)
        self._collector = MetricsCollector() if config.enable_metrics else None
        self._constraints = ConstraintSet.for_runner(grammar, self._runner_config)
        self.grammar = grammar  # read-only: None means a constraint is refused at submit
        self._lifecycle = Lifecycle(self._scheduler, self._collector, self._constraints.release)
        self._transaction = Transaction(
            runner,
            self._scheduler,
            self._lifecycle,
            max_retries=config.max_retries,
            vocab_size=self._runner_config.vocab_size,
            collector=self._collector,
            constraints=self._constraints,
        )
        self._pipeline = make_pipeline(
            overlap,
            runner,
            self._runner_config,
            self._transaction,
            self._scheduler,
            self._constraints,
        )
        self._speculator: Speculator | None = None
        self.speculation = speculation
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
    def arena(self) -> ArenaReport:
        """How the arena is split and how many full-context sequences each region holds."""
        return arena_report(self._layout, self._config)

    @property
    def overlap(self) -> bool:
        """Whether decode steps are pipelined (submit n+1 before collecting n)."""
        return self._pipeline is not None

    @property
    def speculation(self) -> Speculation | None:
        """Speculative decoding's knob (None: off). It may be set between steps, from the next
        decode step on (a benchmark compares both ways on one bound runner)."""
        return None if self._speculator is None else self._speculator.speculation

    @speculation.setter
    def speculation(self, speculation: Speculation | None) -> None:
        self._speculator = (
            None
            if speculation is None
            else Speculator(
                speculation, self._runner_config, self._config.max_batch_tokens, self._collector
            )
        )

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
        return self._lifecycle.dead is not None or self._closed

    def submit(
        self,
        prompt_token_ids: Sequence[int],
        sampling_params: SamplingParams | None = None,
        request_id: int | None = None,
        media: Sequence[MediaItem] = (),
        grammar: GrammarState | None = None,
    ) -> Request:
        """Validate and queue a request (`media`: its images, docs/vision.md; `grammar`: its
        constraint's state prepared off this thread); bad input raises `ValueError`."""
        if self.dead:
            raise EngineDeadError(self._lifecycle.dead or "the engine is closed")
        params = SamplingParams() if sampling_params is None else sampling_params
        if not isinstance(params, SamplingParams):
            raise ValueError("sampling_params must be a SamplingParams")
        prompt = validate_prompt(prompt_token_ids, self._runner_config, self._config)
        self._runner_config.check_request(params, bool(media))
        check_params(params, self._runner_config)
        need = self._scheduler.max_pages_for(len(prompt) + 1)
        if need > self._layout.num_pages:
            raise ValueError(
                f"a prompt of {len(prompt)} tokens needs {need} cache pages, "
                f"the cache has {self._layout.num_pages}"
            )
        grammar = self._constraints.check(params, grammar)
        rid = self._lifecycle.take_id(request_id)
        items = validate_media(media, len(prompt), self._config.prefill_chunk_tokens)
        request = Request(rid, prompt, params, items)
        self._constraints.admit(request, grammar)
        self._scheduler.add(request)
        return request

    def cached_prefix(self, prompt: Sequence[int], media: Sequence[MediaItem] = ()) -> int:
        """Prompt tokens the prefix cache holds now (0 without one): read-only, a routing hint."""
        return self._scheduler.cached_prefix(prompt_keys(prompt, media))

    def has_work(self) -> bool:
        busy = self._pipeline is not None and self._pipeline.busy
        return bool(self._pending) or (
            self._lifecycle.dead is None and (busy or self._scheduler.has_work())
        )

    def step(self) -> list[Event]:
        """Run one transaction; return its events (and any from aborts since the last step)."""
        events, self._pending = self._pending, []
        if self._lifecycle.dead is not None or not self._scheduler.has_work():
            if self._pipeline is not None:  # rows of requests that ended while in flight
                self._pipeline.drain(events)
            if self._lifecycle.dead is None:
                self._update_gauges()  # aborts since the last step changed the counts
            return events
        preemptions = self._scheduler.num_preemptions
        # requests whose masks still fill sit out
        self._scheduler.hold(self._constraints.held(self._scheduler))
        cohort = self._scheduler.schedule()
        if cohort is None:
            if self._pipeline is not None:
                self._pipeline.drain(events)
            if self._scheduler.num_preemptions == preemptions:
                self._fail_unfittable(events)
        else:
            self._step_id += 1
            if self._pipeline is None:
                self._run(cohort, events)
            else:
                self._overlapped(self._pipeline, cohort, events)
        self._update_gauges()
        return events

    def abort(self, request: Request | int) -> None:
        """End a request in any state; its `FinishedEvent(abort)` comes with the next step.

        Aborting a finished or unknown request is a no-op."""
        rid = request.id if isinstance(request, Request) else int(request)
        live = self._scheduler.live.get(rid)
        if live is None:
            return
        self._pending.append(self._lifecycle.finish(live, FinishReason.ABORT))

    def close(self) -> None:
        """Abort everything, close the runner; `submit` raises from now on. Idempotent."""
        if self._closed:
            return
        if self._pipeline is not None:  # the device finishes what it was given
            self._pipeline.drain(self._pending)
        for request in list(self._scheduler.live.values()):
            self._pending.append(self._lifecycle.finish(request, FinishReason.ABORT))
        self._closed = True
        self._constraints.close()
        if isinstance(self._runner, ClosableRunner):
            self._runner.close()

    def check_invariants(self) -> None:
        """Cache refcounts match what live requests (and the prefix trie) hold."""
        self._scheduler.check_invariants()

    def __enter__(self) -> Engine:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    # -- one step -------------------------------------------------------------------------
    def _run(self, cohort: Cohort, events: list[Event]) -> None:
        planned = self._plan(cohort)
        if planned is None:
            return
        plan, reserved = planned
        requests = reserved.requests
        if self._constraints.active:
            plan = self._constraints.attach(plan, requests)
        self._transaction.execute(plan, requests, reserved.pages, events)

    def _plan(
        self, cohort: Cohort, chained: Pipeline | None = None
    ) -> tuple[BatchPlan, ReservedCohort] | None:
        """Drafts (speculation), pages, then the plan; None when the pages did not fit."""
        drafts: DraftStep | None = None
        if self._speculator is not None and cohort.phase is Phase.DECODE:
            drafts = self._speculator.extend(cohort, self._scheduler)
            cohort = cohort if drafts is None else drafts.cohort
        reserved = self._scheduler.reserve(cohort)
        if reserved is None:
            return None
        store = self._scheduler.slot_store
        if drafts is None:
            prev = None if chained is None else chained.chained(reserved.slots)
            plan = build_plan(self._step_id, reserved, store, prev)
        else:
            plan = drafts.plan(self._step_id, reserved, store)
        return plan, reserved

    def _overlapped(self, pipe: Pipeline, cohort: Cohort, events: list[Event]) -> None:
        """Pipeline pure decode steps; drain before prefill, drafts, or constrained rows
        a runner cannot wait masks for."""
        if (
            cohort.phase is Phase.PREFILL
            or self._constraints.drains
            or self._speculator is not None
        ):
            if pipe.busy:
                pipe.drain(events)
                if cohort.phase is Phase.DECODE or self._lifecycle.dead is not None:
                    return  # planned on in-flight rows that may have ended: schedule afresh
            self._run(cohort, events)
            return
        planned = self._plan(cohort, pipe)
        if planned is not None:
            plan, reserved = planned
            pipe.launch(pipe.chain_states(plan), reserved.requests, reserved.pages, events)
        pipe.settle(events)

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
        events.append(self._lifecycle.finish(head, FinishReason.ERROR, message))

    def _update_gauges(self) -> None:
        c = self._collector
        if c is None:
            return
        usage = self._scheduler.cache_usage()
        with c.lock:
            c.running = self._scheduler.num_admitted
            c.waiting = len(self._scheduler.waiting)
            c.cache_usage = usage.live  # live requests' pages only
            c.prefix_cache_usage = usage.prefix  # evictable cached pages
            c.preemptions = self._scheduler.num_preemptions
            c.prefix_queries = usage.prefix_queries
            c.prefix_hits = usage.prefix_hits
