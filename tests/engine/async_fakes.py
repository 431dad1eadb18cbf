"""Overlapping asynchronous fake runners: `CacheSimRunner` behind `submit` / `collect`.

`OverlapSimRunner` runs each plan when it is submitted (in submission order, as a device
stream would), after resolving `prev_token_rows` from the tokens the previous accepted plan
sampled, and hands the outputs back in order from `collect`. Its tokens come from what it
reads back through the cache, so a wrongly chained row, a wrong position or State page, or a
page freed too early makes the tokens diverge from `naive_generate`.
`FaultyOverlapRunner` adds seeded faults at submit and at collect.
"""

from __future__ import annotations

import random
from collections import deque
from dataclasses import dataclass, field, replace

import numpy as np

from resin import (
    BatchPlan,
    ForwardOutput,
    Phase,
    RetryableRunnerError,
    RunnerConfig,
    RunnerDeadError,
    State,
)
from tests.engine.fakes import CacheSimRunner, FakeRunnerBug


@dataclass
class OverlapSimRunner(CacheSimRunner):
    """See the module docstring. `forward` is hidden: the engine must use submit/collect."""

    waiting: deque[ForwardOutput] = field(default_factory=deque)
    sampled: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    chained_rows: int = 0
    """Rows that took their input from the previous plan (tests check overlap happened)."""
    max_waiting: int = 0

    forward = None  # type: ignore[assignment]

    @property
    def runner_config(self) -> RunnerConfig:
        return replace(super().runner_config, overlap=True)

    def submit(self, plan: BatchPlan) -> None:
        if len(self.waiting) >= 2:
            raise FakeRunnerBug("a third plan submitted while two are uncollected")
        out = self._run(self._resolve(plan))
        self.waiting.append(out)
        self.max_waiting = max(self.max_waiting, len(self.waiting))

    def collect(self) -> ForwardOutput:
        if not self.waiting:
            raise FakeRunnerBug("collect without a submitted plan")
        return self.waiting.popleft()

    def _run(self, plan: BatchPlan) -> ForwardOutput:
        out = CacheSimRunner.forward(self, plan)
        sampled = np.full(plan.num_sequences, -1, dtype=np.int64)
        sampled[plan.sample_rows] = out.token_ids
        self.sampled = sampled
        return out

    def _resolve(self, plan: BatchPlan) -> BatchPlan:
        prev = plan.prev_token_rows
        if not prev.size:
            if (plan.input_ids < 0).any():
                raise FakeRunnerBug("input id -1 without prev_token_rows")
            return plan
        if prev.shape != (plan.num_sequences,):
            raise FakeRunnerBug("prev_token_rows must have one entry per row")
        rows = np.flatnonzero(prev >= 0)
        if rows.size and plan.phase is not Phase.DECODE:
            raise FakeRunnerBug("only decode rows chain")
        firsts = plan.query_indptr[rows]
        if (plan.input_ids[firsts] != -1).any():
            raise FakeRunnerBug("a chained row's input id must be -1")
        src = self.sampled[prev[rows]] if rows.size else np.zeros(0, dtype=np.int64)
        if (src < 0).any() or (prev[rows] >= self.sampled.size).any():
            raise FakeRunnerBug("a chained row points at a row that sampled nothing")
        ids = plan.input_ids.copy()
        ids[firsts] = src
        if (ids < 0).any():
            raise FakeRunnerBug("input id -1 on an unchained row")
        self.chained_rows += int(rows.size)
        return replace(plan, input_ids=ids)


@dataclass
class FaultyOverlapRunner(OverlapSimRunner):
    """Seeded faults (at most one step in `1 / rate`): a refused submit (retryable), a
    non-retryable submit error, a crash reported at collect after the step wrote garbage into
    the cache, an invalid output (bad row count, token out of range), or death."""

    seed: int = 0
    rate: float = 0.1
    kinds: tuple[str, ...] = ("retry", "refuse", "crash", "bad-count", "bad-token")
    faults: list[str] = field(default_factory=list)
    pending: deque[str] = field(default_factory=deque)

    def submit(self, plan: BatchPlan) -> None:
        rng = random.Random(self.seed * 100003 + plan.step_id * 7 + len(self.faults))
        kind = rng.choice(self.kinds) if rng.random() < self.rate else ""
        if kind in ("retry", "refuse", "dead-submit"):
            self.faults.append(kind)
            if kind == "retry":
                raise RetryableRunnerError("device busy")
            if kind == "dead-submit":
                raise RunnerDeadError("device lost")
            raise ValueError("plan rejected")
        super().submit(plan)
        if kind == "crash":  # the step wrote garbage where it wrote, as a real fault might
            for spec, gp in zip(self.groups, plan.cache_groups, strict=True):
                if isinstance(spec, State):
                    for page in gp.state_out.tolist():
                        self.states[page] = (12345, ())
                else:
                    self.arena[gp.append_slots] = 999_999
        self.pending.append(kind)

    def collect(self) -> ForwardOutput:
        out = super().collect()
        kind = self.pending.popleft()
        if kind:
            self.faults.append(kind)
        if kind == "crash":
            raise RuntimeError("kernel fault after launch")
        if kind == "dead-collect":
            raise RunnerDeadError("device lost")
        if kind == "bad-count":
            return ForwardOutput(out.token_ids[:0], np.zeros(out.token_indptr.size, np.uint32))
        if kind == "bad-token" and out.token_ids.size:
            ids = out.token_ids.copy()
            ids[0] = self.vocab + 5
            return ForwardOutput(ids, out.token_indptr)
        return out
