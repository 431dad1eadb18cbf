"""The engine equals the naive loop: random workloads on the cache-simulating fake runner."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from resin import Engine, History
from tests.engine.fakes import CacheSimRunner, naive_generate
from tests.engine.workload import check_lifecycle, expect_abort_or_equal, jobs_strategy, run_jobs

VOCAB = 40


@st.composite
def history_setups(draw: st.DrawFn) -> tuple[CacheSimRunner, dict[str, int], list]:
    page_size = draw(st.sampled_from([1, 2, 4, 8]))
    context_length = draw(st.integers(8, 48))
    jobs = draw(jobs_strategy(VOCAB, max_prompt=min(30, context_length - 1)))
    jobs = [j for j in jobs if len(j.prompt) < context_length]
    # The pool fits every request alone (else it could never finish); tiny pools force retraction.
    alone = (
        max(
            -(-min(len(j.prompt) + j.params.max_output_tokens, context_length) // page_size)
            for j in jobs
        )
        if jobs
        else 1
    )
    num_pages = alone + draw(st.integers(0, 12))
    knobs = {
        "context_length": context_length,
        "max_batch_tokens": draw(st.integers(1, 64)),
        "prefill_chunk_tokens": draw(st.integers(1, 32)),
        "max_sequences": draw(st.integers(1, 8)),
    }
    runner = CacheSimRunner(
        groups=(History(),), page_size=page_size, num_pages=num_pages, vocab=VOCAB
    )
    return runner, knobs, jobs


@settings(max_examples=120, deadline=None)
@given(history_setups())
def test_history_engine_equals_naive_loop(
    setup: tuple[CacheSimRunner, dict[str, int], list],
) -> None:
    runner, knobs, jobs = setup
    engine = Engine(runner, **knobs)
    outcome = run_jobs(engine, jobs)
    check_lifecycle(outcome, jobs)
    for i, job in enumerate(jobs):
        want, want_reason = naive_generate(
            runner.groups, job.prompt, job.params, VOCAB, knobs["context_length"]
        )
        handle = outcome.requests[i]
        expect_abort_or_equal(
            handle.output_token_ids,
            handle.finish_reason,
            want,
            want_reason,
            job.abort_at is not None,
        )
    assert engine.cache.pool.num_free == engine.layout.num_pages, "pages leaked"
