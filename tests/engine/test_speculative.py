"""Speculative decoding in the engine equals the naive loop: random workloads (batching,
chunked prefill, prefix hits, retraction from tiny pools, stop tokens and length limits inside
accepted drafts, aborts, logprobs) with the oracle, n-gram and draft-model proposers; faults in
verify steps; refusals; metrics."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from resin import (
    Engine,
    History,
    SamplingParams,
    Window,
)
from resin.engine.proposers import DraftModelProposer, NgramProposer
from resin.engine.speculative import Speculation
from tests.engine.fakes import CacheSimRunner, fake_logprob, naive_generate
from tests.engine.spec_fakes import OracleProposer, SpecCacheSimRunner, TruthProposer
from tests.engine.workload import (
    Job,
    check_lifecycle,
    check_logprobs,
    expect_abort_or_equal,
    jobs_strategy,
    run_jobs,
)

VOCAB = 12  # small: stop tokens and n-gram repeats are common
SHARED = tuple((5 * i + 2) % VOCAB for i in range(20))
MIXES = [(History(),), (Window(5),), (Window(8), History())]


@st.composite
def spec_setups(draw: st.DrawFn, proposer: str) -> tuple[Engine, SpecCacheSimRunner, list[Job]]:
    groups = draw(st.sampled_from(MIXES))
    page_size = draw(st.sampled_from([1, 2, 4, 8]))
    context_length = draw(st.integers(12, 48))
    jobs = draw(jobs_strategy(VOCAB, max_prompt=min(24, context_length - 1), max_out=16,
                              prefix=SHARED))  # fmt: skip
    jobs = [j for j in jobs if len(j.prompt) < context_length] or [
        Job(0, jobs[0].prompt[: context_length - 1], jobs[0].params)
    ]
    longest = max(
        -(-min(len(j.prompt) + j.params.max_output_tokens, context_length) // page_size)
        for j in jobs
    )
    num_pages = len(groups) * (longest + 3) + draw(st.integers(0, 12))
    runner = SpecCacheSimRunner(groups=groups, page_size=page_size, num_pages=num_pages,
                                vocab=VOCAB)  # fmt: skip
    k = draw(st.integers(1, 8))
    if proposer == "oracle":
        prop: object = OracleProposer(runner, seed=draw(st.integers(0, 10**6)))
    elif proposer == "ngram":
        prop = NgramProposer(max_ngram=3, min_ngram=1)
    else:
        draft = CacheSimRunner(groups=groups, page_size=page_size, num_pages=None, vocab=VOCAB)
        prop = DraftModelProposer(draft, context_length=context_length, max_sequences=8)
    engine = Engine(
        runner,
        context_length=context_length,
        max_batch_tokens=draw(st.integers(1, 64)),
        prefill_chunk_tokens=draw(st.integers(1, 32)),
        max_sequences=draw(st.integers(1, 8)),
        prefix_cache=draw(st.booleans()),
        speculation=Speculation(prop, k),  # type: ignore[arg-type]
    )
    return engine, runner, jobs


def check_equal(engine: Engine, runner: SpecCacheSimRunner, jobs: list[Job]) -> None:
    outcome = run_jobs(engine, jobs)
    check_lifecycle(outcome, jobs)
    check_logprobs(outcome, jobs, fake_logprob)
    for i, job in enumerate(jobs):
        want, want_reason = naive_generate(
            runner.groups, job.prompt, job.params, VOCAB, engine.context_length
        )
        handle = outcome.requests[i]
        expect_abort_or_equal(
            handle.output_token_ids,  # type: ignore[attr-defined]
            handle.finish_reason,  # type: ignore[attr-defined]
            want,
            want_reason,
            job.abort_at is not None,
        )
    engine.check_invariants()
    engine._scheduler.cache.drop_prefix_cache()
    assert engine._scheduler.cache.pool.num_free == engine.layout.num_pages, "pages leaked"
    VERIFIED.extend(runner.verified)


VERIFIED: list[tuple[int, int]] = []


@settings(max_examples=150, deadline=None)
@given(spec_setups("oracle"))
def test_oracle_drafts_equal_the_naive_loop(
    setup: tuple[Engine, SpecCacheSimRunner, list[Job]],
) -> None:
    check_equal(*setup)


@settings(max_examples=60, deadline=None)
@given(spec_setups("ngram"))
def test_ngram_drafts_equal_the_naive_loop(
    setup: tuple[Engine, SpecCacheSimRunner, list[Job]],
) -> None:
    check_equal(*setup)


@settings(max_examples=40, deadline=None)
@given(spec_setups("draft"))
def test_draft_model_equals_the_naive_loop(
    setup: tuple[Engine, SpecCacheSimRunner, list[Job]],
) -> None:
    check_equal(*setup)


def test_workloads_saw_full_partial_and_no_acceptance() -> None:
    # Runs after the property tests in this module: every acceptance outcome was exercised.
    if VERIFIED:
        assert any(a == d for d, a in VERIFIED if d > 0)
        assert any(0 < a < d for d, a in VERIFIED)
        assert any(a == 0 for d, a in VERIFIED if d > 0)


def _run(engine: Engine, prompts: list[list[int]], params: SamplingParams) -> list[list[int]]:
    handles = [engine.submit(p, params) for p in prompts]
    while engine.has_work():
        engine.step()
        engine.check_invariants()
    return [h.take_result() for h in handles]


def test_stops_inside_accepted_drafts_cut_where_one_token_steps_would() -> None:
    groups = (History(),)
    prompt = [3, 1, 4, 1, 5]
    free, _ = naive_generate(groups, prompt, SamplingParams(max_output_tokens=30), VOCAB, 64)
    stop = free[5]
    first = free.index(stop)  # inside the first verify step's 8 accepted drafts
    cases = [
        SamplingParams(max_output_tokens=30, stop_token_ids=[stop]),
        SamplingParams(max_output_tokens=first + 1),
        SamplingParams(max_output_tokens=30, stop_token_ids=[stop], min_output_tokens=first + 2),
        SamplingParams(max_output_tokens=30, stop_token_ids=[stop], ignore_stop_tokens=True),
    ]
    for params in cases:
        runner = SpecCacheSimRunner(groups=groups, num_pages=64, vocab=VOCAB)
        engine = Engine(runner, context_length=64,
                        speculation=Speculation(TruthProposer(runner), 8))  # fmt: skip
        handle = engine.submit(prompt, params)
        _run(engine, [], params)
        truth = naive_generate(groups, prompt, params, VOCAB, 64)
        assert (handle.take_result(), handle.finish_reason) == truth
        drafts, accepted = runner.verified[0]
        assert drafts == accepted == (8 if params.max_output_tokens == 30 else first - 1)
        engine.check_invariants()
