"""Fakes for speculative decoding: a cache-simulating runner that verifies drafts, and a
proposer that knows the fake model (so drafts are right for a random stretch, then wrong).

`SpecCacheSimRunner` reads every draft row's context back through its page rows at each query
position, so a rejected draft the engine failed to roll back (a stale page handed to a later
step or to the prefix cache) changes what later tokens read, and outputs leave the naive loop.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from resin import BatchPlan, ForwardOutput, RunnerConfig
from resin.engine.request import Request
from resin.plan import Phase
from tests.engine.fakes import CacheSimRunner, FakeRunnerBug, _combine, fake_logprobs, next_token


@dataclass
class SpecCacheSimRunner(CacheSimRunner):
    """`CacheSimRunner` (History / Window groups) plus draft verification."""

    max_draft_tokens: int = 8
    verified: list[tuple[int, int]] = field(default_factory=list)
    """(drafts, accepted) per draft row verified."""

    @property
    def runner_config(self) -> RunnerConfig:
        return RunnerConfig(
            vocab_size=self.vocab,
            page_size=self.page_size,
            cache_groups=self.groups,
            num_pages=self.num_pages,
            max_draft_tokens=self.max_draft_tokens,
        )

    def forward(self, plan: BatchPlan) -> ForwardOutput:
        if not plan.draft_ids.size:
            return super().forward(plan)
        if self.layout is None or plan.phase is not Phase.DECODE:
            raise FakeRunnerBug("drafts in a prefill plan, or before bind")
        if self.keep_plans:
            self.plans.append(plan)
        k = np.diff(plan.draft_indptr)
        if not np.array_equal(plan.query_lens, k + 1) or k.max() > self.max_draft_tokens:
            raise FakeRunnerBug("a draft row has 1 + k query tokens")
        for gp in plan.cache_groups:
            self.arena[gp.append_slots] = plan.input_ids
        out: list[int] = []
        indptr = [0]
        for i in range(plan.num_sequences):
            lo, hi = int(plan.query_indptr[i]), int(plan.query_indptr[i + 1])
            if not np.array_equal(plan.input_ids[lo + 1 : hi], plan.draft_ids[
                    plan.draft_indptr[i] : plan.draft_indptr[i + 1]]):  # fmt: skip
                raise FakeRunnerBug("draft ids differ from the row's query tokens")
            for t in range(lo, hi):
                p = int(plan.positions[t])
                parts = [
                    self._read(spec, gp, i, p)  # type: ignore[arg-type]
                    for spec, gp in zip(self.groups, plan.cache_groups, strict=True)
                ]
                tok = _combine(parts) % self.vocab
                out.append(tok)
                if t + 1 == hi or int(plan.input_ids[t + 1]) != tok:
                    break
            self.verified.append((hi - lo - 1, len(out) - indptr[-1] - 1))
            indptr.append(len(out))
        ids = np.asarray(out, dtype=np.uint32)
        return ForwardOutput(
            token_ids=ids,
            token_indptr=np.asarray(indptr, dtype=np.uint32),
            **fake_logprobs(plan, ids),
        )


@dataclass
class OracleProposer:
    """Proposes the fake model's true continuation for a random number of tokens, then random
    tokens (so rows see full, partial and no acceptance)."""

    runner: CacheSimRunner
    seed: int = 0
    calls: int = 0

    def propose(self, requests: Sequence[Request], limits: Sequence[int]) -> list[list[int]]:
        rng = random.Random(self.seed * 7919 + self.calls)
        self.calls += 1
        out = []
        for r, k in zip(requests, limits, strict=True):
            tokens = list(r.token_array(r.num_tokens)[: r.num_tokens])
            right = rng.randint(0, k)
            drafts = []
            for j in range(rng.randint(0, k)):
                if j < right:
                    tok = next_token(self.runner.groups, tokens, 0, self.runner.vocab)
                else:
                    tok = rng.randrange(self.runner.vocab)
                drafts.append(tok)
                tokens.append(tok)
            out.append(drafts)
        return out


@dataclass
class TruthProposer:
    """Always proposes the fake model's true continuation, as many tokens as allowed."""

    runner: CacheSimRunner

    def propose(self, requests: Sequence[Request], limits: Sequence[int]) -> list[list[int]]:
        out = []
        for r, k in zip(requests, limits, strict=True):
            tokens = list(r.token_array(r.num_tokens)[: r.num_tokens])
            for _ in range(k):
                tokens.append(next_token(self.runner.groups, tokens, 0, self.runner.vocab))
            out.append(tokens[r.num_tokens :])
        return out
