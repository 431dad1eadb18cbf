"""The engine equals the naive loop: random workloads on the cache-simulating fake runner.

History, Window, State and Compressed groups (alone and mixed in one arena), tiny page pools
that force retraction, random chunk sizes, token budgets, sequence caps, arrivals and aborts.
A Compressed group always comes with a State group: the runner keeps the pending tail there.
"""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from resin import CacheGroupSpec, Compressed, Engine, History, State, Window
from resin.cache.groups import sequence_pages
from tests.engine.fakes import CacheSimRunner, fake_logprob, naive_generate
from tests.engine.workload import (
    Job,
    check_lifecycle,
    check_logprobs,
    expect_abort_or_equal,
    jobs_strategy,
    run_jobs,
)

VOCAB = 40
Setup = tuple[CacheSimRunner, dict[str, object], list[Job]]

GROUP_MIXES: list[tuple[CacheGroupSpec, ...]] = [
    (Window(5),),
    (State(),),
    (History(), Window(3), State()),
    (Window(8), History()),
]

COMPRESSED_MIXES: list[tuple[CacheGroupSpec, ...]] = [
    (Window(4), Compressed(2), Compressed(8), State()),
    (History(), Compressed(4), State()),
    (Compressed(1), State(), Window(3)),
]
"""Ratios 1-8 against page sizes 1-8: entries per page from 1 to 8, pages spanning 1 to 8
token pages."""


@st.composite
def setups(
    draw: st.DrawFn,
    mixes: list[tuple[CacheGroupSpec, ...]] | None = None,
    prefix_cache: bool | None = False,
    shared_prefix: tuple[int, ...] = (),
) -> Setup:
    groups = draw(st.sampled_from(mixes or [(History(),)]))
    page_size = draw(st.sampled_from([1, 2, 4, 8]))
    # A Compressed ratio must divide the page size or be a multiple of it (powers of two).
    context_length = draw(st.integers(8, 48))
    jobs = draw(jobs_strategy(VOCAB, max_prompt=min(30, context_length - 1), prefix=shared_prefix))
    jobs = [j for j in jobs if len(j.prompt) < context_length] or [jobs[0]]
    if len(jobs[0].prompt) >= context_length:
        jobs = [Job(0, jobs[0].prompt[: context_length - 1], jobs[0].params)]
    chunk = draw(st.integers(1, 32))
    # The pool fits every request alone (else it could never finish), from exactly what the
    # engine says the longest one holds at its peak (`sequence_pages`) to room for every group
    # as History; tiny pools force retraction.
    longest = max(min(len(j.prompt) + j.params.max_output_tokens, context_length) for j in jobs)
    exact, _ = sequence_pages(groups, longest, min(chunk, context_length), page_size)
    alone = len(groups) * (-(-longest // page_size) + 3)
    num_pages = draw(st.integers(max(1, exact), max(exact, alone) + 12))
    knobs: dict[str, object] = {
        "context_length": context_length,
        "max_batch_tokens": draw(st.integers(1, 64)),
        "prefill_chunk_tokens": chunk,
        "max_sequences": draw(st.integers(1, 8)),
        "prefix_cache": draw(st.booleans()) if prefix_cache is None else prefix_cache,
    }
    runner = CacheSimRunner(groups=groups, page_size=page_size, num_pages=num_pages, vocab=VOCAB)
    return runner, knobs, jobs


def check_equal(runner: CacheSimRunner, knobs: dict[str, object], jobs: list[Job]) -> Engine:
    engine = Engine(runner, **knobs)  # type: ignore[arg-type]
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
    for pool in engine._scheduler.cache.pools:  # the token region and the state region
        assert pool.num_free == pool.num_pages, "pages leaked"
    return engine


@settings(max_examples=100, deadline=None)
@given(setups())
def test_history_engine_equals_naive_loop(setup: Setup) -> None:
    check_equal(*setup)


@settings(max_examples=100, deadline=None)
@given(setups(GROUP_MIXES))
def test_window_and_state_engine_equals_naive_loop(setup: Setup) -> None:
    check_equal(*setup)


@settings(max_examples=100, deadline=None)
@given(setups(COMPRESSED_MIXES, prefix_cache=None, shared_prefix=tuple(range(3, 27))))
def test_compressed_engine_equals_naive_loop(setup: Setup) -> None:
    # Chunked prefill, retraction (tiny pools), aborts and (half the time) prefix hits.
    check_equal(*setup)


SHARED = tuple((7 * i + 3) % VOCAB for i in range(24))
HITS: list[int] = []


@settings(max_examples=150, deadline=None)
@given(
    setups([(History(),), *GROUP_MIXES, *COMPRESSED_MIXES], prefix_cache=True, shared_prefix=SHARED)
)
def test_prefix_cache_engine_equals_naive_loop(setup: Setup) -> None:
    engine = check_equal(*setup)
    HITS.append(engine._scheduler.cache.prefix_hits)


def test_prefix_cache_workloads_did_hit() -> None:
    # Runs after the property test in this module: shared prefixes must have produced hits.
    if HITS:
        assert sum(h > 0 for h in HITS) >= len(HITS) // 10
