"""Scheduler policy: phases, budgets, caps, the queue-age rule, retraction, abort anywhere."""

from __future__ import annotations

import numpy as np

from resin import Engine, FinishedEvent, FinishReason, History, Phase, SamplingParams, Window
from resin.engine.request import Status
from tests.engine.fakes import CacheSimRunner, naive_generate

VOCAB = 50


def _drain(engine: Engine) -> list[object]:
    events: list[object] = []
    while engine.has_work():
        events.extend(engine.step())
        engine.check_invariants()
    return events


def test_plans_are_phase_homogeneous_and_respect_budget_chunk_and_cap() -> None:
    runner = CacheSimRunner(page_size=4, num_pages=400, vocab=VOCAB, keep_plans=True)
    engine = Engine(
        runner, context_length=128, max_batch_tokens=20, prefill_chunk_tokens=7, max_sequences=3
    )
    rng = np.random.default_rng(0)
    requests = [
        engine.submit(rng.integers(0, VOCAB, size=int(rng.integers(1, 40))).tolist(),
                      SamplingParams(max_output_tokens=int(rng.integers(1, 8))))
        for _ in range(12)
    ]  # fmt: skip
    peak = 0
    while engine.has_work():
        engine.step()
        peak = max(peak, engine.num_running)
    assert peak == 3
    for plan in runner.plans:
        assert plan.num_tokens <= 20 and plan.num_sequences <= 3
        if plan.phase is Phase.DECODE:
            assert np.all(plan.query_lens == 1) and plan.sample_rows.all()
        else:
            assert np.all(plan.query_lens <= 7)
    for r in requests:
        want, _ = naive_generate((History(),), r.prompt_token_ids, r.sampling_params, VOCAB, 128)
        assert r.take_result() == want


def test_queue_age_rule_keeps_decode_going_under_a_stream_of_prompts() -> None:
    runner = CacheSimRunner(page_size=8, num_pages=2000, vocab=VOCAB, keep_plans=True)
    engine = Engine(runner, context_length=512, max_batch_tokens=64, prefill_chunk_tokens=64)
    first = engine.submit([1, 2, 3], SamplingParams(max_output_tokens=30, ignore_stop_tokens=True))
    engine.step()
    assert first.status is Status.DECODE
    for _ in range(60):  # a new 200-token prompt every step: prefill work never runs out
        engine.submit([t % VOCAB for t in range(200)], SamplingParams(max_output_tokens=1))
        engine.step()
    phases = [p.phase for p in runner.plans[1:]]
    streak = longest = 0
    for phase in phases:
        streak = streak + 1 if phase is Phase.PREFILL else 0
        longest = max(longest, streak)
    assert longest <= engine._scheduler.config.max_prefill_streak
    assert len(first.output_token_ids) >= 60 // (engine._scheduler.config.max_prefill_streak + 1)


def test_retraction_takes_the_youngest_and_keeps_generated_tokens() -> None:
    runner = CacheSimRunner(page_size=2, num_pages=14, vocab=VOCAB)
    engine = Engine(runner, context_length=64, max_batch_tokens=64)
    params = SamplingParams(max_output_tokens=12, ignore_stop_tokens=True)
    requests = [engine.submit([i + 1, i + 2, i + 3], params) for i in range(3)]
    outputs: dict[int, list[int]] = {r.id: [] for r in requests}
    while engine.has_work():
        engine.step()
        engine.check_invariants()
        admitted = [r for r in requests if r.status in (Status.PREFILL, Status.DECODE)]
        retracted = [r for r in requests if r.status is Status.WAITING and r.output_token_ids]
        for victim in retracted:
            assert all(victim.arrival > r.arrival for r in admitted), "an older one was retracted"
        for r in requests:  # generated tokens are never lost
            assert r.output_token_ids[: len(outputs[r.id])] == outputs[r.id]
            outputs[r.id] = list(r.output_token_ids)
    assert engine._scheduler.num_preemptions > 0
    assert engine._scheduler.num_preemptions <= 6, "retraction thrashed"
    for r in requests:
        want, _ = naive_generate((History(),), r.prompt_token_ids, params, VOCAB, 64)
        assert r.take_result() == want


def test_abort_in_every_state() -> None:
    runner = CacheSimRunner(page_size=2, num_pages=14, vocab=VOCAB)
    engine = Engine(
        runner, context_length=64, max_batch_tokens=64, prefill_chunk_tokens=2, max_sequences=2
    )
    params = SamplingParams(max_output_tokens=12, ignore_stop_tokens=True)
    decoding = engine.submit([1, 2, 3], params)
    engine.step()
    engine.step()
    assert decoding.status is Status.DECODE
    prefilling = engine.submit([4, 5, 6, 7, 8, 9], params)
    waiting = engine.submit([9, 9], params, request_id=99)
    engine.step()
    assert (
        prefilling.status is Status.PREFILL
        and engine._scheduler.slot_store.num_computed[prefilling.slot] == 2
    )
    assert waiting.status is Status.WAITING
    engine.abort(prefilling)
    engine.abort(99)
    engine.abort(12345)  # unknown: no-op
    events = _drain(engine)
    finished = [e for e in events if isinstance(e, FinishedEvent)]
    reasons = {e.request_id: e.reason for e in finished}
    assert reasons[prefilling.id] is FinishReason.ABORT and reasons[99] is FinishReason.ABORT
    engine.abort(decoding)  # finished: no-op
    assert engine.step() == [] and decoding.finish_reason is FinishReason.LENGTH
    assert engine._scheduler.cache.pool.num_free == 14

    # Retracted (waiting with generated tokens), then aborted.
    longer = SamplingParams(max_output_tokens=16, ignore_stop_tokens=True)
    a = engine.submit([1, 2, 3], longer)
    b = engine.submit([4, 5, 6], longer)
    while not (b.status is Status.WAITING and b.output_token_ids):
        engine.step()
        assert engine.has_work()
    engine.abort(b)
    events = _drain(engine)
    assert [e.reason for e in events if isinstance(e, FinishedEvent) and e.request_id == b.id] == [
        FinishReason.ABORT
    ]
    assert a.finish_reason is FinishReason.LENGTH and engine._scheduler.cache.pool.num_free == 14


def test_window_storage_per_sequence_is_bounded() -> None:
    runner = CacheSimRunner(groups=(Window(6),), page_size=2, num_pages=40, vocab=VOCAB)
    engine = Engine(runner, context_length=400)
    params = SamplingParams(max_output_tokens=200, ignore_stop_tokens=True)
    request = engine.submit(list(range(30)), params)
    while engine.has_work():
        engine.step()
        if request.slot >= 0:
            assert engine._scheduler.cache.groups[0].held(request.slot).size <= 6 // 2 + 1
    want, _ = naive_generate((Window(6),), list(range(30)), params, VOCAB, 400)
    assert request.take_result() == want
