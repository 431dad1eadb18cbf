"""Overlap scheduling with fake runners: the pipelined engine produces exactly the events of a
synchronous one (batching, chunked prefill, prefix hits, retraction, stops, aborts, max
tokens), leaks no page, publishes nothing extra to the prefix cache, and keeps the meaning of
transactions under injected faults."""

from __future__ import annotations

import random
from dataclasses import dataclass

import pytest

from resin import (
    CacheGroupSpec,
    Engine,
    EngineDeadError,
    ErrorEvent,
    FinishedEvent,
    FinishReason,
    History,
    Phase,
    SamplingParams,
    State,
    TokensEvent,
    Window,
)
from resin.events import Event
from tests.engine.async_fakes import FaultyOverlapRunner, OverlapSimRunner
from tests.engine.fakes import CacheSimRunner, naive_generate

VOCAB = 40
GROUPS: dict[str, tuple[CacheGroupSpec, ...]] = {
    "history": (History(),),
    "hybrid": (History(), Window(6), State()),
}


@dataclass(frozen=True)
class Job:
    arrival: int
    prompt: tuple[int, ...]
    params: SamplingParams
    abort_after: int | None = None
    """Abort once this many tokens were observed (None: never)."""


def _jobs(seed: int, n: int = 14, shared: int = 9, spread: int = 10) -> list[Job]:
    rng = random.Random(seed)
    prefix = [rng.randrange(VOCAB) for _ in range(shared)]
    jobs = []
    for _ in range(n):
        head = prefix[: rng.randrange(shared + 1)]
        prompt = tuple(head + [rng.randrange(VOCAB) for _ in range(rng.randint(1, 14))])
        params = SamplingParams(
            max_output_tokens=rng.randint(1, 18),
            stop_token_ids=rng.sample(range(VOCAB), rng.randint(0, 3)),
            min_output_tokens=rng.choice([0, 0, 1]),
            temperature=0.0,
            logprobs=rng.choice([None, None, 0, 2]),
            prompt_logprobs=rng.choice([None, None, None, 1]),
        )
        abort = rng.choice([None, None, None, 0, 1, 3])
        jobs.append(Job(rng.randint(0, spread), prompt, params, abort))
    return jobs


def _drive(engine: Engine, jobs: list[Job], check: bool = True) -> dict[int, list[Event]]:
    """Submit each job at its arrival step, abort after its observed tokens, step until done."""
    events: dict[int, list[Event]] = {i: [] for i in range(len(jobs))}
    seen = dict.fromkeys(range(len(jobs)), 0)
    pending = sorted(range(len(jobs)), key=lambda i: jobs[i].arrival)
    step = 0
    while pending or engine.has_work():
        while pending and jobs[pending[0]].arrival <= step:
            i = pending.pop(0)
            engine.submit(jobs[i].prompt, jobs[i].params, request_id=i)
            if jobs[i].abort_after == 0:
                engine.abort(i)
        for event in engine.step():
            ids = event.request_ids if isinstance(event, ErrorEvent) else (event.request_id,)
            for rid in ids:
                events[rid].append(event)
            if isinstance(event, TokensEvent):
                seen[event.request_id] += len(event.token_ids)
                if seen[event.request_id] == jobs[event.request_id].abort_after:
                    engine.abort(event.request_id)
        if check:
            engine.check_invariants()
        step += 1
        assert step < 5000
    return events


def _stream(events: list[Event]) -> list[tuple[object, ...]]:
    """What a caller sees of one request (prefix-hit lengths aside: retraction timing)."""
    out: list[tuple[object, ...]] = []
    for e in events:
        if isinstance(e, TokensEvent):
            out.append(("tok", e.token_ids, e.logprobs, e.top_logprobs, e.prompt_logprobs))
        elif isinstance(e, FinishedEvent):
            out.append(("end", e.reason, e.num_output_tokens))
        else:
            out.append(("err", e.retryable))
    return out


def _engine(runner: CacheSimRunner, prefix_cache: bool, **kw: object) -> Engine:
    kw = {"context_length": 48, "max_sequences": 8, "max_batch_tokens": 24} | kw
    return Engine(runner, prefix_cache=prefix_cache, prefill_chunk_tokens=5, **kw)  # type: ignore[arg-type]


@pytest.mark.parametrize("num_pages", [400, 24], ids=["roomy", "tight"])
@pytest.mark.parametrize("prefix_cache", [False, True], ids=["plain", "prefix"])
@pytest.mark.parametrize("groups", sorted(GROUPS))
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_overlap_events_equal_synchronous(
    seed: int, groups: str, prefix_cache: bool, num_pages: int
) -> None:
    spec = GROUPS[groups]
    jobs = _jobs(seed, spread=10 if num_pages > 100 else 2)
    sync_runner = CacheSimRunner(groups=spec, page_size=4, num_pages=num_pages, vocab=VOCAB)
    sync = _drive(_engine(sync_runner, prefix_cache), jobs)
    runner = OverlapSimRunner(groups=spec, page_size=4, num_pages=num_pages, vocab=VOCAB)
    engine = _engine(runner, prefix_cache)
    assert engine.overlap
    piped = _drive(engine, jobs)
    assert runner.chained_rows > 0 and runner.max_waiting == 2
    for i, job in enumerate(jobs):
        assert _stream(piped[i]) == _stream(sync[i]), f"request {i}"
        if job.abort_after is None:
            tokens = [t for e in piped[i] if isinstance(e, TokensEvent) for t in e.token_ids]
            want, _ = naive_generate(spec, job.prompt, job.params, VOCAB, 48)
            assert tokens == want, f"request {i}"
    _no_leak(engine)


@pytest.mark.parametrize("groups", sorted(GROUPS))
def test_retraction_of_rows_in_flight_stays_exact(groups: str) -> None:
    """Requests that outgrow a tiny pool are retracted while their next token is in flight:
    the token is dropped, the request recomputes and its stream equals the synchronous one."""
    spec = GROUPS[groups]
    params = SamplingParams(max_output_tokens=14, ignore_stop_tokens=True)
    jobs = [Job(0, (i + 1, i + 2, i + 3), params) for i in range(4)]
    streams, preempted = [], []
    for cls in (CacheSimRunner, OverlapSimRunner):
        runner = cls(groups=spec, page_size=2, num_pages=24, vocab=VOCAB)
        engine = Engine(runner, context_length=64, max_batch_tokens=64)
        events = _drive(engine, jobs)
        streams.append([_stream(events[i]) for i in range(len(jobs))])
        preempted.append(engine._scheduler.num_preemptions)
        _no_leak(engine)
    assert streams[0] == streams[1]
    assert preempted[1] > 0, preempted


def _no_leak(engine: Engine) -> None:
    engine.check_invariants()
    engine._scheduler.cache.drop_prefix_cache()
    pool = engine._scheduler.cache.pool
    assert pool.num_free == pool.num_pages


@pytest.mark.parametrize("groups", sorted(GROUPS))
def test_late_stops_publish_nothing_extra(groups: str) -> None:
    """A request that stops while its next token is in flight publishes only what a
    synchronous run computed: the prefix tries end up identical."""
    spec = GROUPS[groups]
    tries = []
    for cls in (CacheSimRunner, OverlapSimRunner):
        engine = _engine(cls(groups=spec, page_size=4, num_pages=400, vocab=VOCAB), True)
        reqs = []
        for n in range(1, 9):  # outputs ending on every offset of a page
            prompt = [(7 * n + k) % VOCAB for k in range(5 + n)]
            reqs.append(engine.submit(prompt, SamplingParams(max_output_tokens=n + 2)))
        while engine.has_work():
            engine.step()
            engine.check_invariants()
        trie = engine._scheduler.cache.prefix.trie  # type: ignore[union-attr]
        tries.append(
            (
                trie.num_nodes,
                sum(p.size for p in trie.held_pages()),
                [r.output_token_ids for r in reqs],
            )
        )
    assert tries[0] == tries[1]


def test_overlap_flag() -> None:
    with pytest.raises(ValueError, match="overlap=True"):
        Engine(CacheSimRunner(vocab=VOCAB), overlap=True)
    assert not Engine(CacheSimRunner(vocab=VOCAB)).overlap
    runner = OverlapSimRunner(vocab=VOCAB, num_pages=64)
    engine = Engine(runner, overlap=False)  # off for debugging: one plan at a time
    request = engine.submit([1, 2, 3], SamplingParams(max_output_tokens=6))
    while engine.has_work():
        engine.step()
    assert len(request.output_token_ids) == 6
    assert runner.chained_rows == 0 and runner.max_waiting == 1


def test_constrained_requests_drain_the_pipeline() -> None:
    runner = OverlapSimRunner(vocab=VOCAB, num_pages=64, keep_plans=True)
    engine = Engine(runner, context_length=48)
    free = engine.submit([1, 2, 3], SamplingParams(max_output_tokens=20))
    for _ in range(5):
        engine.step()
    assert runner.chained_rows > 0
    biased = engine.submit([4, 5], SamplingParams(max_output_tokens=4, logit_bias=((3, 1.0),)))
    start = len(runner.plans)
    while not biased.finished:
        engine.step()
    assert all(not (p.prev_token_rows >= 0).any() for p in runner.plans[start:])
    while engine.has_work():
        engine.step()
    assert free.finish_reason is FinishReason.LENGTH and len(free.output_token_ids) == 20


def test_close_drains() -> None:
    runner = OverlapSimRunner(vocab=VOCAB, num_pages=64)
    engine = Engine(runner, context_length=48)
    request = engine.submit([1, 2, 3], SamplingParams(max_output_tokens=20))
    for _ in range(4):
        engine.step()
    assert len(runner.waiting) == 1  # one plan in flight between steps
    engine.close()
    assert not runner.waiting
    events = engine.step()
    ends = [e for e in events if isinstance(e, FinishedEvent)]
    assert [e.reason for e in ends] == [FinishReason.ABORT]
    assert request.finish_reason is FinishReason.ABORT
    with pytest.raises(EngineDeadError):
        engine.submit([1], SamplingParams())


# -- faults --------------------------------------------------------------------------------
@pytest.mark.parametrize("prefix_cache", [False, True], ids=["plain", "prefix"])
@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_random_faults_quarantine_exactly_and_leave_others_exact(
    seed: int, prefix_cache: bool
) -> None:
    spec = GROUPS["hybrid"]
    runner = FaultyOverlapRunner(groups=spec, page_size=4, num_pages=300, vocab=VOCAB, seed=seed)
    runner.rate = 0.25
    engine = _engine(runner, prefix_cache, max_retries=10)
    jobs = [j for j in _jobs(seed + 10, n=24) if j.abort_after is None]
    events = _drive(engine, jobs)
    assert len(set(runner.faults)) >= 3, runner.faults
    errored = 0
    for i, job in enumerate(jobs):
        ends = [e for e in events[i] if isinstance(e, FinishedEvent)]
        assert len(ends) == 1 and events[i][-1] is ends[0], f"request {i}: {events[i]}"
        tokens = [t for e in events[i] if isinstance(e, TokensEvent) for t in e.token_ids]
        want, reason = naive_generate(spec, job.prompt, job.params, VOCAB, 48)
        if ends[0].reason is FinishReason.ERROR:
            errored += 1
            assert tokens == want[: len(tokens)], f"request {i}"
        else:
            assert (tokens, ends[0].reason) == (want, reason), f"request {i}"
    assert errored > 0
    _no_leak(engine)


def _crash_once(kind: str, at_step: int = 0) -> FaultyOverlapRunner:
    """One fault of `kind` at the first decode plan from step `at_step` on, or once `armed`."""
    runner = FaultyOverlapRunner(groups=GROUPS["hybrid"], page_size=4, num_pages=200, vocab=VOCAB)
    runner.rate = 0.0
    original = runner.submit
    armed = {"on": at_step > 0}

    def submit(plan):  # type: ignore[no-untyped-def]
        fire = armed["on"] and plan.step_id >= at_step and plan.phase is Phase.DECODE
        if fire:
            runner.rate, runner.kinds, armed["on"] = 1.0, (kind,), False
        try:
            original(plan)
        finally:
            runner.rate = 0.0

    runner.submit = submit  # type: ignore[method-assign]
    runner.arm = lambda: armed.update(on=True)  # type: ignore[attr-defined]
    return runner


@pytest.mark.parametrize("kind", ["crash", "bad-count", "bad-token", "refuse"])
def test_failed_step_quarantines_exactly_its_requests(kind: str) -> None:
    """Two requests decode in the pipeline when a step fails (at collect, with the step behind
    it in flight, or at submit): each ends with exactly one error and no token after it, the
    row in flight behind it is dropped, and requests that come later are exact."""
    runner = _crash_once(kind)
    engine = _engine(runner, False)
    a = engine.submit([1, 2, 3], SamplingParams(max_output_tokens=30))
    b = engine.submit([4, 5], SamplingParams(max_output_tokens=30))
    events: list[Event] = []
    for _ in range(6):
        events += engine.step()
    assert runner.chained_rows > 0 and len(runner.waiting) == 1
    runner.arm()  # type: ignore[attr-defined]
    while not a.finished:
        events += engine.step()
    late = engine.submit([7] * 12, SamplingParams(max_output_tokens=5))
    while engine.has_work():
        events += engine.step()
        engine.check_invariants()
    assert runner.faults == [kind]
    assert a.finish_reason is b.finish_reason is FinishReason.ERROR
    for r in (a, b):
        mine = [e for e in events if getattr(e, "request_id", None) == r.id]
        assert isinstance(mine[-1], FinishedEvent)
        assert sum(isinstance(e, FinishedEvent) for e in mine) == 1
        assert sum(len(e.token_ids) for e in mine if isinstance(e, TokensEvent)) == len(
            r.output_token_ids
        )
        want, _ = naive_generate(GROUPS["hybrid"], r.prompt_token_ids, r.sampling_params, VOCAB, 48)
        assert r.output_token_ids == want[: len(r.output_token_ids)]
    want, _ = naive_generate(
        GROUPS["hybrid"], late.prompt_token_ids, late.sampling_params, VOCAB, 48
    )
    assert late.output_token_ids == want and late.finish_reason is FinishReason.LENGTH
    _no_leak(engine)


def test_refused_submit_is_retried_and_stays_exact() -> None:
    runner = _crash_once("retry", at_step=5)
    engine = _engine(runner, False)
    reqs = [engine.submit([i, i + 1, i + 2], SamplingParams(max_output_tokens=12)) for i in (1, 9)]
    events: list[Event] = []
    while engine.has_work():
        events += engine.step()
        engine.check_invariants()
    assert runner.faults == ["retry"]
    assert any(isinstance(e, ErrorEvent) and e.retryable for e in events)
    for r in reqs:
        want, _ = naive_generate(GROUPS["hybrid"], r.prompt_token_ids, r.sampling_params, VOCAB, 48)
        assert r.output_token_ids == want and r.finish_reason is FinishReason.LENGTH
    _no_leak(engine)


@pytest.mark.parametrize("kind", ["dead-submit", "dead-collect"])
def test_dead_runner_in_flight_ends_everything(kind: str) -> None:
    runner = _crash_once(kind, at_step=5)
    engine = _engine(runner, False)
    reqs = [engine.submit([i, i + 1], SamplingParams(max_output_tokens=12)) for i in (1, 9)]
    events: list[Event] = []
    while engine.has_work():
        events += engine.step()
    assert engine.dead and runner.faults == [kind]
    for r in reqs:
        ends = [e for e in events if isinstance(e, FinishedEvent) and e.request_id == r.id]
        assert [e.reason for e in ends] == [FinishReason.ERROR]
    with pytest.raises(EngineDeadError):
        engine.submit([1], SamplingParams())
    engine.close()  # nothing left to drain from a dead runner


def test_runner_dies_while_draining_before_a_prefill() -> None:
    runner = _crash_once("dead-collect", at_step=4)
    engine = _engine(runner, False)
    first = engine.submit([1, 2, 3], SamplingParams(max_output_tokens=30))
    events: list[Event] = []
    while "dead-collect" not in runner.pending:  # the doomed step is in flight
        events += engine.step()
    late = engine.submit([5, 6, 7, 8], SamplingParams(max_output_tokens=3))
    while engine.has_work():  # a prefill is scheduled (admitting `late`); the drain dies
        events += engine.step()
    assert engine.dead
    for r in (first, late):
        ends = [e for e in events if isinstance(e, FinishedEvent) and e.request_id == r.id]
        assert [e.reason for e in ends] == [FinishReason.ERROR]
    assert late.output_token_ids == []
