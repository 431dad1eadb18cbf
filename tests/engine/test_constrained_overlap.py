"""Constrained decode steps in the overlap pipeline (`engine/pipeline.py`).

Plan n+1 is submitted before step n is collected; its mask is filled only after step n was
committed and its grammars advanced, and the runner samples it only then (it defers the
sampling to the next submit or the collect, as CudaRunner does). The fake runner here picks
tokens deterministically among the allowed ones (by sequence, output index and seed), so a
pipelined run must give exactly the outputs of a synchronous one; a mask filled from a grammar
that was not advanced yet would allow the wrong tokens and the outputs would diverge (or fail
the constraint). Faults: a refused submit (retryable and not), a failing collect, aborts and
grammar stops while the next row is in flight. Also the reference TorchRunner, and plain
traffic (no mask enters any plan)."""

from __future__ import annotations

from collections import deque
from typing import Any

import numpy as np
import pytest

from resin import (
    BatchPlan,
    Constraint,
    Engine,
    FinishReason,
    ForwardOutput,
    GrammarBackend,
    RetryableRunnerError,
    RunnerConfig,
    SamplingParams,
)
from resin.tokenizer import Tokenizer
from tests.engine.test_constraints import SCHEMA, allowed, backend, tokenizer

__all__ = ["backend", "tokenizer"]  # fixtures


class DeferringRunner:
    """An overlapping AsyncRunner that obeys masks; `faults` maps a submit (or, for "crash",
    a collect) ordinal to a fault."""

    def __init__(self, vocab: int, faults: dict[int, str] | None = None) -> None:
        self.runner_config = RunnerConfig(
            vocab_size=vocab, page_size=16, num_pages=2048, waits_for_masks=True, overlap=True
        )
        self.vocab = vocab
        self.faults = faults or {}
        self.waiting: deque[ForwardOutput | Exception] = deque()
        self.deferred: BatchPlan | None = None
        self.plans: list[BatchPlan] = []
        self.submits = self.collects = 0
        self.pipelined_masks = 0
        """Masked plans submitted while the plan before them was uncollected."""

    def submit(self, plan: BatchPlan) -> None:
        self._sample_deferred()
        self.submits += 1
        kind = self.faults.get(self.submits, "")
        if kind == "retry":
            raise RetryableRunnerError("device busy")
        if kind == "refuse":
            raise ValueError("plan rejected")
        assert len(self.waiting) < 2, "a third plan in flight"
        if plan.sampling.token_bitmask is not None and self.waiting:
            self.pipelined_masks += 1
        if plan.sampling.mask_pending is not None:
            self.deferred = plan
        else:
            self.waiting.append(self._sample(plan))

    def collect(self) -> ForwardOutput:
        if not self.waiting:
            self._sample_deferred()
        self.collects += 1
        out = self.waiting.popleft()
        if isinstance(out, Exception):
            raise out
        if self.faults.get(-self.collects) == "crash":
            raise RuntimeError("kernel fault")
        return out

    def _sample_deferred(self) -> None:
        plan, self.deferred = self.deferred, None
        if plan is not None:
            try:
                self.waiting.append(self._sample(plan))
            except Exception as exc:
                self.waiting.append(exc)

    def _sample(self, plan: BatchPlan) -> ForwardOutput:
        self.plans.append(plan)
        mask = plan.sampling.bitmask()
        s = plan.sampling
        out = []
        for i in np.flatnonzero(plan.sample_rows):
            ok = np.arange(self.vocab) if mask is None else allowed(mask[i], self.vocab)
            if s.temperature[i] == 0:
                out.append(int(ok[0]))
            else:
                key = int(plan.sequence_ids[i]) * 7919 + int(s.output_index[i]) * 104729
                out.append(int(ok[(key + int(s.seed[i])) % ok.size]))
        indptr = np.zeros(plan.num_sequences + 1, dtype=np.uint32)
        indptr[1:] = np.cumsum(plan.sample_rows)
        return ForwardOutput(np.asarray(out, dtype=np.uint32), indptr)


def _params(tok: Tokenizer, i: int, constrained: bool = True) -> SamplingParams:
    kinds = [Constraint.json_schema(SCHEMA), Constraint("regex", "(yes|no)[0-9]{2,9}")]
    return SamplingParams(
        max_output_tokens=60,
        stop_token_ids=tok.eos_token_ids,
        constraint=kinds[i % 2] if constrained else None,
        temperature=0.0 if i % 3 == 0 else 1.0,
        seed=i,
    )


def _drive(engine: Engine, tok: Tokenizer, n: int, aborts: dict[int, int] | None = None,
           constrained: bool = True) -> list[tuple[list[int], FinishReason | None]]:  # fmt: skip
    """n requests (json_schema / regex, greedy / seeded); request i is aborted once it has
    `aborts[i]` tokens; returns each request's tokens and finish reason."""
    aborts = aborts or {}
    reqs = [engine.submit([1, 2, 3 + i], _params(tok, i, constrained)) for i in range(n)]
    while engine.has_work():
        engine.step()
        engine.check_invariants()
        for i, k in aborts.items():
            if len(reqs[i].output_token_ids) >= k and not reqs[i].finished:
                engine.abort(reqs[i])
    assert engine._constraints._gated is None
    return [(r.output_token_ids, r.finish_reason) for r in reqs]


def _both(tok: Tokenizer, backend: GrammarBackend, n: int, **kw: Any) -> tuple[Any, Any, Any]:
    got = {}
    for overlap in (False, True):
        runner = DeferringRunner(tok.vocab_size)
        with Engine(runner, grammar=backend, overlap=overlap) as engine:
            got[overlap] = _drive(engine, tok, n, **kw)
    return got[False], got[True], runner


def test_pipelined_constrained_steps_equal_synchronous(
    tokenizer: Tokenizer, backend: GrammarBackend
) -> None:
    sync, piped, runner = _both(tokenizer, backend, 10)
    assert piped == sync
    assert runner.pipelined_masks > 10  # constrained steps did pipeline
    assert all(reason is FinishReason.STOP for _, reason in sync)


def test_aborts_while_in_flight_equal_synchronous(
    tokenizer: Tokenizer, backend: GrammarBackend
) -> None:
    sync, piped, _ = _both(tokenizer, backend, 9, aborts={0: 1, 1: 3, 4: 5, 7: 2})
    assert piped == sync
    assert [sync[i][1] for i in (0, 1, 4, 7)] == [FinishReason.ABORT] * 4


def test_grammar_stop_drops_the_late_token(tokenizer: Tokenizer, backend: GrammarBackend) -> None:
    # The regex completes after 2-9 digits (a grammar stop or EOS); the engine cannot know
    # before the commit, so the request's next row is already in flight: that token is dropped.
    runner = DeferringRunner(tokenizer.vocab_size)
    with Engine(runner, grammar=backend) as engine:
        reqs = [engine.submit([4, i], _params(tokenizer, 1)) for i in range(6)]
        states = [r.grammar for r in reqs]
        while engine.has_work():
            engine.step()
    late = 0
    for r, state in zip(reqs, states, strict=True):
        assert r.finish_reason is FinishReason.STOP and state is not None
        n = len(r.output_token_ids)
        eos = r.output_token_ids[-1] in tokenizer.eos_token_ids  # ends the request at commit
        assert state.consumed == n - eos and state.error is None
        late += any(
            r.id in p.sequence_ids.tolist()
            and p.sampling.output_index[p.sequence_ids.tolist().index(r.id)] == n
            for p in runner.plans
        )
    assert late  # a row past the grammar's stop was sampled and never committed


@pytest.mark.parametrize("kind", ["retry", "refuse", "crash"])
def test_faults_on_the_constrained_pipeline(
    tokenizer: Tokenizer, backend: GrammarBackend, kind: str
) -> None:
    clean, _, _ = _both(tokenizer, backend, 8)
    at = {"retry": 6, "refuse": 6, "crash": -5}[kind]  # decode steps, pipelined
    runner = DeferringRunner(tokenizer.vocab_size, faults={at: kind})
    with Engine(runner, grammar=backend, overlap=True) as engine:
        got = _drive(engine, tokenizer, 8)
        assert runner.pipelined_masks
    failed = [i for i, (_, reason) in enumerate(got) if reason is FinishReason.ERROR]
    if kind == "retry":
        assert got == clean and not failed
    else:
        assert failed  # exactly the failed plan's requests are quarantined
    for i, (tokens, reason) in enumerate(got):
        if i in failed:
            assert tokens == clean[i][0][: len(tokens)]
        else:
            assert (tokens, reason) == clean[i]


def test_plain_traffic_is_unchanged(tokenizer: Tokenizer, backend: GrammarBackend) -> None:
    sync, piped, runner = _both(tokenizer, backend, 6, constrained=False)
    assert piped == sync
    assert all(p.sampling.token_bitmask is None and p.sampling.mask_pending is None
               for p in runner.plans)  # fmt: skip
    assert any(p.prev_token_rows.size and (p.prev_token_rows >= 0).any() for p in runner.plans)


def _recording(inner: Any, seen: list[BatchPlan]) -> Any:
    def submit(plan: BatchPlan) -> None:
        seen.append(plan)
        inner(plan)

    return submit


def test_reference_runner_pipelines_constrained_steps(
    tokenizer: Tokenizer, backend: GrammarBackend
) -> None:
    from resin_model.default_model import default_model_dir
    from resin_models_torch.registry import load_runner

    got = {}
    for overlap in (False, True):
        runner = load_runner(default_model_dir(), page_size=16)
        submitted: list[BatchPlan] = []
        runner.submit = _recording(runner.submit, submitted)  # type: ignore[method-assign]
        with Engine(runner, grammar=backend, overlap=overlap) as engine:
            reqs = [
                engine.submit(tokenizer.encode(f"Answer {i}:"), _params(tokenizer, i))
                for i in range(5)
            ]
            while engine.has_work():
                engine.step()
        got[overlap] = [(r.output_token_ids, r.finish_reason) for r in reqs]
        chained = [
            p for p in submitted if p.sampling.mask_pending and (p.prev_token_rows >= 0).any()
        ]
        assert bool(chained) == overlap
    assert got[True] == got[False]
    assert all(reason is FinishReason.STOP for _, reason in got[True])
