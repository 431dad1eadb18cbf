"""Execution transactions: retry, quarantine, dead runner, async runners, invalid outputs."""

from __future__ import annotations

import random
from dataclasses import dataclass, field

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from resin import (
    BatchPlan,
    Engine,
    EngineDeadError,
    ErrorEvent,
    FinishedEvent,
    FinishReason,
    ForwardOutput,
    History,
    RetryableRunnerError,
    RunnerDeadError,
    SamplingParams,
    State,
    Window,
)
from tests.engine.fakes import CacheSimRunner, SampleZeroRunner, ZeroRunner, naive_generate

VOCAB = 50


@dataclass
class FaultyRunner(CacheSimRunner):
    """Fails at random steps (at most one in ten): retryable before accepting, an exception
    after writing to the cache, or an invalid output."""

    seed: int = 0
    faults: list[str] = field(default_factory=list)

    def forward(self, plan: BatchPlan) -> ForwardOutput:
        rng = random.Random(self.seed * 100003 + plan.step_id)
        kind = (
            rng.choice(["retry", "crash", "bad-count", "bad-token"]) if rng.random() < 0.1 else ""
        )
        if kind == "retry":
            self.faults.append(kind)
            raise RetryableRunnerError("device busy")
        out = super().forward(plan)  # writes the cache, like a real step would
        if kind:
            self.faults.append(kind)
        if kind == "crash":  # leave garbage where the step wrote, as a real fault might
            for spec, gp in zip(self.groups, plan.cache_groups, strict=True):
                if isinstance(spec, State):
                    self.states[gp.state_out] = np.uint64(12345)
                    self.states[gp.checkpoint_page] = np.uint64(12345)
                else:
                    self.arena[gp.append_slots] = 999_999
            raise RuntimeError("kernel fault after launch")
        if kind == "bad-count":
            return ForwardOutput(out.token_ids[:0], np.zeros(plan.num_sequences + 1, np.uint32))
        if kind == "bad-token" and out.token_ids.size:
            ids = out.token_ids.copy()
            ids[0] = VOCAB + 5
            return ForwardOutput(ids, out.token_indptr)
        return out


@pytest.mark.parametrize("prefix_cache", [False, True])
def test_random_faults_lose_nothing_and_leave_others_exact(prefix_cache: bool) -> None:
    rng = np.random.default_rng(1)
    groups = (History(), Window(6), State())
    runner = FaultyRunner(groups=groups, page_size=4, num_pages=600, vocab=VOCAB, seed=3)
    engine = Engine(
        runner, context_length=64, prefix_cache=prefix_cache, max_sequences=24, max_batch_tokens=96
    )
    shared = rng.integers(0, VOCAB, size=12).tolist()
    jobs = []
    for _ in range(1000):
        prompt = (
            shared[: int(rng.integers(0, 13))]
            + rng.integers(0, VOCAB, size=int(rng.integers(1, 10))).tolist()
        )
        jobs.append(
            (prompt, SamplingParams(max_output_tokens=int(rng.integers(1, 6)), temperature=0.0))
        )
    requests, finished = [], {}
    pending = list(jobs)
    while pending or engine.has_work():
        for prompt, params in pending[:8]:
            requests.append(engine.submit(prompt, params))
        pending = pending[8:]
        for event in engine.step():
            if isinstance(event, FinishedEvent):
                assert event.request_id not in finished
                finished[event.request_id] = event
    engine.check_invariants()
    assert len(finished) == 1000 and len(runner.faults) >= 20
    errors = 0
    for request, (prompt, params) in zip(requests, jobs, strict=True):
        event = finished[request.id]
        if event.reason is FinishReason.ERROR:
            errors += 1
            assert event.error and request.error == event.error
            continue
        want, reason = naive_generate(groups, prompt, params, VOCAB, 64)
        assert (request.take_result(), request.finish_reason) == (want, reason)
    assert 0 < errors < 1000
    engine._scheduler.cache.drop_prefix_cache()
    assert engine._scheduler.cache.pool.num_free == engine.layout.num_pages


class AlwaysRetry(SampleZeroRunner):
    def forward(self, plan: BatchPlan) -> ForwardOutput:
        raise RetryableRunnerError("not now")


def test_bounded_retries_then_error() -> None:
    engine = Engine(AlwaysRetry(), max_retries=3)
    request = engine.submit([1, 2, 3])
    events = []
    while engine.has_work():
        events.extend(engine.step())
    retryable = [e for e in events if isinstance(e, ErrorEvent) and e.retryable]
    assert len(retryable) == 3
    assert request.finish_reason is FinishReason.ERROR and "gave up" in (request.error or "")
    assert engine._scheduler.cache.pool.num_free == engine.layout.num_pages


class DiesAtStep(SampleZeroRunner):
    def __init__(self, step: int) -> None:
        self.step = step
        self.closed = False

    def forward(self, plan: BatchPlan) -> ForwardOutput:
        if plan.step_id >= self.step:
            raise RunnerDeadError("GPU fell off the bus")
        return super().forward(plan)

    def close(self) -> None:
        self.closed = True


def test_dead_runner_ends_every_request_and_refuses_new_work() -> None:
    runner = DiesAtStep(3)
    engine = Engine(runner)
    requests = [engine.submit([1, 2], SamplingParams(max_output_tokens=50)) for _ in range(3)]
    waiting = engine.submit([3] * 5000, SamplingParams(max_output_tokens=5))
    events = []
    while engine.has_work():
        events.extend(engine.step())
    for r in [*requests, waiting]:
        assert r.finish_reason is FinishReason.ERROR and "GPU fell off" in (r.error or "")
        assert sum(isinstance(e, FinishedEvent) and e.request_id == r.id for e in events) == 1
    with pytest.raises(EngineDeadError):
        engine.submit([1])
    engine.close()
    assert runner.closed


class AsyncFake:
    """Only submit/collect: the engine must drive it as an AsyncRunner."""

    def __init__(self) -> None:
        self.inner = CacheSimRunner(groups=(History(),), page_size=4, num_pages=64, vocab=VOCAB)
        self.runner_config = self.inner.runner_config
        self.pending: BatchPlan | None = None
        self.refuse_next = True

    def bind(self, layout: object) -> None:
        self.inner.bind(layout)  # type: ignore[arg-type]

    def submit(self, plan: BatchPlan) -> None:
        assert self.pending is None, "one plan in flight"
        if self.refuse_next:
            self.refuse_next = False
            raise RetryableRunnerError("queue full")
        self.pending = plan

    def collect(self) -> ForwardOutput:
        assert self.pending is not None
        plan, self.pending = self.pending, None
        return self.inner.forward(plan)


def test_async_runner_submit_collect() -> None:
    runner = AsyncFake()
    engine = Engine(runner, context_length=64)
    params = SamplingParams(max_output_tokens=5)
    request = engine.submit([5, 6, 7, 8, 9], params)
    while engine.has_work():
        engine.step()
    want, _ = naive_generate((History(),), [5, 6, 7, 8, 9], params, VOCAB, 64)
    assert request.take_result() == want


class WrongShape(ZeroRunner):
    def forward(self, plan: BatchPlan) -> ForwardOutput:
        return ForwardOutput(np.zeros(3, np.uint32), np.arange(4, dtype=np.uint32))


def test_wrong_shape_is_an_error_event_not_a_crash() -> None:
    engine = Engine(WrongShape())
    request = engine.submit([1])
    events = engine.step()
    assert isinstance(events[0], ErrorEvent) and not events[0].retryable
    assert "token_indptr" in events[0].message
    assert request.finish_reason is FinishReason.ERROR
    assert not engine.has_work() and not engine.dead


@settings(max_examples=80, deadline=None)
@given(
    st.integers(0, 4),
    st.integers(0, 4),
    st.sampled_from([np.uint32, np.int64, np.float32]),
    st.integers(-3, 2 * VOCAB),
    st.booleans(),
)
def test_garbage_outputs_never_crash_the_engine(
    n_ids: int, n_indptr: int, dtype: type, value: int, with_logprobs: bool
) -> None:
    class Garbage(SampleZeroRunner):
        def forward(self, plan: BatchPlan) -> ForwardOutput:
            lps = np.zeros(n_ids, np.float32) if with_logprobs else None
            return ForwardOutput(
                np.full(n_ids, value).astype(dtype),  # type: ignore[arg-type]
                np.arange(n_indptr).astype(dtype),  # type: ignore[arg-type]
                logprobs=lps,
            )

    runner = Garbage()
    engine = Engine(runner, context_length=64)
    params = SamplingParams(max_output_tokens=3, logprobs=0, prompt_logprobs=1)
    requests = [engine.submit([1, 2, 3], params), engine.submit([4, 5], SamplingParams())]
    while engine.has_work():
        engine.step()
        engine.check_invariants()
    assert all(r.finished for r in requests)
    assert engine._scheduler.cache.pool.num_free == engine.layout.num_pages
