"""Speculative decoding: faults in verify steps, refusals, broken proposers, constrained rows,
and the spec_decode metrics."""

from __future__ import annotations

import random
from dataclasses import dataclass, field

import numpy as np
import pytest

from resin import (
    BatchPlan,
    Engine,
    FinishedEvent,
    FinishReason,
    ForwardOutput,
    History,
    RetryableRunnerError,
    SamplingParams,
    State,
    TokensEvent,
    Window,
)
from resin.engine.speculative import Speculation
from resin.metrics import PrometheusExporter
from tests.engine.fakes import CacheSimRunner, naive_generate
from tests.engine.spec_fakes import OracleProposer, SpecCacheSimRunner, TruthProposer

VOCAB = 30


@dataclass
class FaultySpecRunner(SpecCacheSimRunner):
    """Fails one step in eight (verify steps included): retryable before accepting, a crash
    after writing the cache (garbage left where drafts went), or an invalid output."""

    seed: int = 0
    faults: list[tuple[str, bool]] = field(default_factory=list)

    def forward(self, plan: BatchPlan) -> ForwardOutput:
        rng = random.Random(self.seed * 100003 + plan.step_id)
        kinds = ["retry", "crash", "bad-count", "bad-token"]
        kind = rng.choice(kinds) if rng.random() < 0.125 else ""
        drafts = bool(plan.draft_ids.size)
        if kind == "retry":
            self.faults.append((kind, drafts))
            raise RetryableRunnerError("device busy")
        out = super().forward(plan)
        if kind:
            self.faults.append((kind, drafts))
        if kind == "crash":
            for gp in plan.cache_groups:
                self.arena[gp.append_slots] = 999_999
            raise RuntimeError("kernel fault after launch")
        if kind == "bad-count":  # one token too many for some row
            extra = np.append(out.token_ids, np.uint32(1))
            indptr = out.token_indptr.copy()
            indptr[-1] += 1
            return ForwardOutput(extra, indptr)
        if kind == "bad-token" and out.token_ids.size:
            ids = out.token_ids.copy()
            ids[-1] = VOCAB + 5
            return ForwardOutput(ids, out.token_indptr)
        return out


@pytest.mark.parametrize("prefix_cache", [False, True])
def test_faults_in_verify_steps_quarantine_exactly_their_requests(prefix_cache: bool) -> None:
    rng = np.random.default_rng(2)
    groups = (History(), Window(6))
    runner = FaultySpecRunner(groups=groups, page_size=4, num_pages=400, vocab=VOCAB, seed=5)
    engine = Engine(
        runner, context_length=64, prefix_cache=prefix_cache, max_sequences=16,
        max_batch_tokens=96, speculation=Speculation(OracleProposer(runner, seed=3), 4),
    )  # fmt: skip
    shared = rng.integers(0, VOCAB, size=12).tolist()
    jobs = []
    for _ in range(400):
        prompt = shared[: int(rng.integers(0, 13))] + rng.integers(0, VOCAB, size=4).tolist()
        params = SamplingParams(max_output_tokens=int(rng.integers(1, 12)), temperature=0.0)
        jobs.append((prompt, params))
    requests, finished = [], {}
    pending = list(jobs)
    while pending or engine.has_work():
        for prompt, params in pending[:6]:
            requests.append(engine.submit(prompt, params))
        pending = pending[6:]
        for event in engine.step():
            if isinstance(event, FinishedEvent):
                assert event.request_id not in finished
                finished[event.request_id] = event
        engine.check_invariants()
    assert len(finished) == 400
    assert sum(d for kind, d in runner.faults if kind != "retry") >= 5, "few verify faults"
    errors = 0
    for request, (prompt, params) in zip(requests, jobs, strict=True):
        if finished[request.id].reason is FinishReason.ERROR:
            errors += 1
            continue
        assert (request.take_result(), request.finish_reason) == naive_generate(
            groups, prompt, params, VOCAB, 64
        )
    assert 0 < errors < 400
    engine._scheduler.cache.drop_prefix_cache()
    assert engine._scheduler.cache.pool.num_free == engine.layout.num_pages


def test_refusals_say_why() -> None:
    proposer = OracleProposer(CacheSimRunner())
    with pytest.raises(ValueError, match="max_draft_tokens is 0"):
        Engine(CacheSimRunner(), speculation=Speculation(proposer))
    with pytest.raises(ValueError, match="State cache groups"):
        Engine(SpecCacheSimRunner(groups=(History(), State())), speculation=Speculation(proposer))
    # A State that keeps what `rewind` rejected drafts need is accepted up to that many drafts.
    rewinding = (History(), State(rewind=4))
    with pytest.raises(ValueError, match="cannot drop 5 rejected"):
        Engine(SpecCacheSimRunner(groups=rewinding), speculation=Speculation(proposer, 5))
    Engine(SpecCacheSimRunner(groups=rewinding), speculation=Speculation(proposer, 4)).close()
    with pytest.raises(ValueError, match="rewind"):
        State(rewind=-1)
    with pytest.raises(ValueError, match="exceeds the runner's max_draft_tokens=8"):
        Engine(SpecCacheSimRunner(), speculation=Speculation(proposer, 9))
    with pytest.raises(ValueError, match="num_draft_tokens"):
        Speculation(proposer, 0)


class BrokenProposer:
    def __init__(self) -> None:
        self.calls = 0

    def propose(self, requests, limits):  # type: ignore[no-untyped-def]
        self.calls += 1
        if self.calls % 3 == 0:
            raise RuntimeError("proposer bug")
        if self.calls % 3 == 1:
            return [[1, 2]]  # wrong row count when the step has more rows
        return [[-4, 3], [VOCAB + 1]] + [[0] * 40] * (len(requests) - 2)  # invalid, too many


def test_broken_proposers_cost_drafts_not_requests() -> None:
    groups = (History(),)
    runner = SpecCacheSimRunner(groups=groups, num_pages=128, vocab=VOCAB)
    engine = Engine(runner, context_length=64, speculation=Speculation(BrokenProposer(), 4))
    prompts = [[i, i + 1, 7] for i in range(5)]
    params = SamplingParams(max_output_tokens=12)
    handles = [engine.submit(p, params) for p in prompts]
    while engine.has_work():
        engine.step()
        engine.check_invariants()
    for h, p in zip(handles, prompts, strict=True):
        assert (h.take_result(), h.finish_reason) == naive_generate(groups, p, params, VOCAB, 64)
    assert max(d for d, _ in runner.verified) <= 4


def test_constrained_rows_carry_no_drafts() -> None:
    runner = SpecCacheSimRunner(num_pages=128, vocab=VOCAB, keep_plans=True)
    engine = Engine(runner, context_length=64, speculation=Speculation(TruthProposer(runner), 4))
    free = engine.submit([1, 2, 3], SamplingParams(max_output_tokens=10))
    biased = engine.submit([4, 5, 6], SamplingParams(max_output_tokens=10, logit_bias=((3, 0.5),)))
    while engine.has_work():
        engine.step()
    verify = [p for p in runner.plans if p.draft_ids.size]
    assert verify
    for plan in verify:
        k = dict(zip(plan.sequence_ids.tolist(), np.diff(plan.draft_indptr).tolist(), strict=True))
        assert k.get(biased.id, 0) == 0 and k.get(free.id, 1) > 0
    assert len(free.take_result()) == len(biased.take_result()) == 10


def test_metrics_count_drafts_and_acceptance_lengths() -> None:
    runner = SpecCacheSimRunner(num_pages=256, vocab=VOCAB)
    engine = Engine(runner, context_length=64,
                    speculation=Speculation(OracleProposer(runner, seed=9), 4))  # fmt: skip
    tokens = 0
    handles = [engine.submit([i, 3, i], SamplingParams(max_output_tokens=20)) for i in range(6)]
    while engine.has_work():
        for e in engine.step():
            if isinstance(e, TokensEvent):
                tokens += len(e.token_ids)
    snap = engine.metrics
    assert snap is not None and snap.spec_decode_acceptance_length is not None
    drafts = [(d, a) for d, a in runner.verified if d > 0]
    assert snap.spec_decode_num_drafts == len(drafts)
    assert snap.spec_decode_num_draft_tokens == sum(d for d, _ in drafts)
    assert snap.spec_decode_num_accepted_tokens == sum(a for _, a in drafts)
    assert snap.spec_decode_acceptance_length.count == len(drafts)
    assert snap.generation_tokens == tokens == sum(len(h.take_result()) for h in handles)
    text = PrometheusExporter(engine).render().decode()
    for name in ("num_drafts_total", "num_draft_tokens_total", "num_accepted_tokens_total",
                 "acceptance_length_bucket"):  # fmt: skip
        assert f"resin:spec_decode_{name}" in text
    plain = Engine(SpecCacheSimRunner(num_pages=64, vocab=VOCAB))
    assert "spec_decode" not in PrometheusExporter(plain).render().decode()
