"""Random workloads for the engine tests: drive an Engine step by step, check it throughout."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field

import pytest
from hypothesis import strategies as st

from resin import Engine, FinishedEvent, FinishReason, SamplingParams, TokensEvent
from resin.events import Event


@dataclass(frozen=True)
class Job:
    arrival: int
    """Step index at which the request is submitted."""
    prompt: tuple[int, ...]
    params: SamplingParams
    abort_at: int | None = None
    """Step index at which it is aborted (None: never)."""


@dataclass
class Outcome:
    events: dict[int, list[Event]] = field(default_factory=lambda: defaultdict(list))
    requests: dict[int, object] = field(default_factory=dict)
    steps: int = 0


def jobs_strategy(
    vocab: int, max_prompt: int, max_jobs: int = 12, max_out: int = 10, prefix: tuple[int, ...] = ()
) -> st.SearchStrategy[list[Job]]:
    params = st.builds(
        SamplingParams,
        max_output_tokens=st.integers(1, max_out),
        stop_token_ids=st.lists(st.integers(0, vocab - 1), max_size=2),
        min_output_tokens=st.just(0),
        ignore_stop_tokens=st.booleans(),
        temperature=st.just(0.0),
        logprobs=st.sampled_from([None, None, 0, 2]),
        prompt_logprobs=st.sampled_from([None, None, None, 0, 1]),
    )
    job = st.builds(
        Job,
        arrival=st.integers(0, 12),
        prompt=st.tuples(
            st.integers(0, len(prefix)),
            st.lists(st.integers(0, vocab - 1), min_size=1, max_size=max_prompt),
        ).map(lambda x: prefix[: x[0]] + tuple(x[1])),
        params=params,
        abort_at=st.one_of(st.none(), st.none(), st.integers(0, 40)),
    )
    return st.lists(job, min_size=1, max_size=max_jobs)


def run_jobs(engine: Engine, jobs: list[Job], max_steps: int = 5000, check: bool = True) -> Outcome:
    """Submit each job at its arrival step, abort at its abort step, step until done."""
    outcome = Outcome()
    pending = sorted(range(len(jobs)), key=lambda i: jobs[i].arrival)
    handles: dict[int, object] = {}
    step = 0
    while pending or engine.has_work():
        while pending and jobs[pending[0]].arrival <= step:
            i = pending.pop(0)
            handles[i] = engine.submit(jobs[i].prompt, jobs[i].params, request_id=i)
        for i, job in enumerate(jobs):
            if job.abort_at == step and i in handles:
                engine.abort(i)
        for event in engine.step():
            if isinstance(event, TokensEvent | FinishedEvent):
                outcome.events[event.request_id].append(event)
            else:
                for rid in event.request_ids:
                    outcome.events[rid].append(event)
        if check:
            engine.check_invariants()
        step += 1
        assert step < max_steps, "the engine did not finish the workload"
    outcome.steps = step
    outcome.requests = handles
    return outcome


def check_lifecycle(outcome: Outcome, jobs: list[Job]) -> None:
    """Every request finished exactly once, last; its token events add up to its output."""
    for i in range(len(jobs)):
        events = [e for e in outcome.events[i] if isinstance(e, TokensEvent | FinishedEvent)]
        finished = [e for e in events if isinstance(e, FinishedEvent)]
        assert len(finished) == 1, f"request {i}: {len(finished)} FinishedEvents"
        assert isinstance(events[-1], FinishedEvent), f"request {i}: FinishedEvent is not last"
        tokens = [t for e in events if isinstance(e, TokensEvent) for t in e.token_ids]
        handle = outcome.requests[i]
        assert tokens == handle.output_token_ids  # type: ignore[attr-defined]
        assert finished[0].reason == handle.finish_reason  # type: ignore[attr-defined]
        assert finished[0].num_output_tokens == len(tokens)


def expect_abort_or_equal(
    got: list[int], reason: FinishReason, want: list[int], want_reason: FinishReason, aborted: bool
) -> None:
    if aborted and reason is FinishReason.ABORT:
        assert got == want[: len(got)], "an aborted request's tokens must be a prefix of the truth"
        return
    assert (got, reason) == (want, want_reason)


def check_logprobs(outcome: Outcome, jobs: list[Job], logprob: Callable[[int], float]) -> None:
    """Logprob fields sit on the right tokens (the fake runner's logprobs are a function of
    the token), and prompt logprobs arrive once, complete, on the first TokensEvent."""
    for i, job in enumerate(jobs):
        events = [e for e in outcome.events[i] if isinstance(e, TokensEvent)]
        for n, e in enumerate(events):
            if job.params.logprobs is None:
                assert e.logprobs is None
            else:
                assert e.logprobs == tuple(pytest.approx(logprob(t)) for t in e.token_ids)
            if n > 0 or job.params.prompt_logprobs is None:
                assert e.prompt_logprobs is None
            else:
                want = [logprob(t) for t in job.prompt[1:]]
                assert e.prompt_logprobs == pytest.approx(want)
