"""Speculative decoding in the engine: propose drafts, plan the verify step, commit what the
runner accepted and roll back the rest (`docs/engine.md`, "Speculative decoding").

A decode step with speculation is still one transaction. Before reserving, `Speculator.extend`
asks the `Proposer` for up to k drafts per eligible row (not constrained; room left under
`max_output_tokens`, the step's token budget and the free pages) and grows the cohort's totals
to `cached + 1 + k`, so pages and append slots are reserved for every draft like any query
token. The runner returns 1..k+1 tokens per row, and the step commits like any other
(`Transaction.commit` -> `Scheduler.commit`, the one commit: a decode row is a verify row with
k = 0): the `SlotStore` stop rule cuts a row where one-token steps would have (a stop token or
the length limit inside the accepted run), and only the kept positions enter the cache, the
pages past them going back first, so the prefix cache never sees a rejected draft.
A failed or refused verify step rolls back or quarantines like any other step.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import numpy as np
import numpy.typing as npt

from resin.engine.request import Request
from resin.engine.scheduler import Cohort, ReservedCohort, Scheduler
from resin.engine.slots import SlotStore
from resin.metrics.collector import MetricsCollector
from resin.plan import BatchPlan, Phase
from resin.protocols import RunnerConfig

I32 = npt.NDArray[np.int32]
_log = logging.getLogger(__name__)


@runtime_checkable
class Proposer(Protocol):
    """Proposes draft tokens that continue requests' sequences (`engine/proposers.py`).

    `propose` gets the decode rows that may speculate and, per row, the most drafts it may
    return (>= 1); it returns one list per row (empty = no drafts for it). It reads each
    request's sequence (`token_array(num_tokens)`, prompt + output so far) and never changes
    engine state. Built-in: n-gram prompt lookup and a draft model; a multi-token-prediction
    head plugs in here too (it would read the target's hidden states from its runner).
    """

    def propose(self, requests: Sequence[Request], limits: Sequence[int]) -> list[list[int]]: ...


@dataclass(frozen=True, slots=True)
class Speculation:
    """The engine knob: who proposes, and at most how many drafts per row and step."""

    proposer: Proposer
    num_draft_tokens: int = 4

    def __post_init__(self) -> None:
        if isinstance(self.num_draft_tokens, bool) or self.num_draft_tokens < 1:
            raise ValueError("num_draft_tokens must be an int >= 1")


@dataclass(frozen=True, slots=True)
class DraftStep:
    """A decode cohort whose row i carries `draft_ids[draft_indptr[i]:draft_indptr[i+1]]`;
    `cohort.totals` already counts the drafts."""

    cohort: Cohort
    draft_indptr: I32
    draft_ids: I32

    def plan(self, step_id: int, reserved: ReservedCohort, slot_store: SlotStore) -> BatchPlan:
        """The verify plan: row i's query tokens are its last token then its drafts."""
        c = reserved.cohort
        b, slots, query_indptr = c.slots.size, c.slots, reserved.query_indptr
        t = int(query_indptr[-1])
        input_ids = np.empty(t, dtype=np.int32)
        is_draft = np.ones(t, dtype=np.bool_)
        is_draft[query_indptr[:-1]] = False
        input_ids[query_indptr[:-1]] = slot_store.last_token[slots]
        input_ids[is_draft] = self.draft_ids
        return BatchPlan(
            step_id=step_id,
            phase=Phase.DECODE,
            sequence_ids=slot_store.seq_id[slots],
            input_ids=input_ids,
            query_indptr=query_indptr,
            positions=reserved.positions,
            cached_lens=c.cached,
            total_lens=c.totals,
            sample_rows=np.ones(b, dtype=np.bool_),
            sampling=slot_store.sampling(slots),
            cache_groups=reserved.cache_groups,
            prompt_logprob_rows=np.zeros(b, dtype=np.bool_),
            target_ids=np.full(t, -1, dtype=np.int32),
            draft_indptr=self.draft_indptr,
            draft_ids=self.draft_ids,
        )


class Speculator:
    """Turns decode cohorts into draft steps (see module docstring)."""

    def __init__(
        self,
        spec: Speculation,
        runner_config: RunnerConfig,
        max_batch_tokens: int,
        collector: MetricsCollector | None,
    ) -> None:
        check_runner(runner_config, spec.num_draft_tokens)
        self.speculation = spec
        self.proposer = spec.proposer
        self.num_draft_tokens = spec.num_draft_tokens
        self.vocab_size = runner_config.vocab_size
        self.max_batch_tokens = max_batch_tokens
        if collector is not None:
            with collector.lock:
                collector.speculative = True

    def extend(self, cohort: Cohort, scheduler: Scheduler) -> DraftStep | None:
        """The cohort with drafts, or None when no row gets any (or their pages do not fit)."""
        slots, b = cohort.slots, cohort.slots.size
        store = scheduler.slot_store
        room = store.limit[slots] - store.num_output[slots] - 1  # k + 1 tokens must fit
        eligible = np.fromiter(  # penalized rows never carry drafts (plan.SamplingArrays)
            (not (r.constrained or r.sampling_params.penalized) for r in cohort.requests),
            np.bool_,
            count=b,
        )
        limits = np.where(eligible, np.clip(room, 0, self.num_draft_tokens), 0)
        budget = self.max_batch_tokens - b
        limits = np.clip(budget - (np.cumsum(limits) - limits), 0, limits)
        rows = np.flatnonzero(limits > 0)
        if rows.size == 0:
            return None
        try:
            proposed = self.proposer.propose(
                [cohort.requests[i] for i in rows.tolist()], limits[rows].tolist()
            )
            if len(proposed) != rows.size:
                raise ValueError(f"{len(proposed)} draft lists for {rows.size} rows")
        except Exception:  # a broken proposer costs the speedup, never the requests
            _log.exception("the draft proposer failed; this step decodes without drafts")
            return None
        drafts: list[list[int]] = [[] for _ in range(b)]
        for i, row_ids in zip(rows.tolist(), proposed, strict=True):
            drafts[i] = self._valid(row_ids, int(limits[i]))
        k = np.fromiter((len(d) for d in drafts), dtype=np.int32, count=b)
        if not k.any():
            return None
        totals = (cohort.cached + 1 + k).astype(np.int32)
        grown = Cohort(Phase.DECODE, cohort.requests, slots, cohort.cached, totals)
        if not scheduler.fits(grown):
            return None  # no room for the drafts: an ordinary decode step instead
        indptr = np.zeros(b + 1, dtype=np.int32)
        np.cumsum(k, out=indptr[1:])
        ids = np.fromiter((t for d in drafts for t in d), dtype=np.int32, count=int(indptr[-1]))
        return DraftStep(grown, indptr, ids)

    def _valid(self, ids: Sequence[int], limit: int) -> list[int]:
        """At most `limit` drafts, up to the first that is not a token id of the runner."""
        out: list[int] = []
        for t in list(ids)[:limit]:
            if not isinstance(t, int | np.integer) or t < 0:
                break
            if self.vocab_size is not None and t >= self.vocab_size:
                break
            out.append(int(t))
        return out


def check_runner(rc: RunnerConfig, num_draft_tokens: int) -> None:
    """Refuse speculation the runner cannot verify, with the reason."""
    if rc.max_draft_tokens < 1:
        raise ValueError(
            "speculative decoding needs a runner that verifies drafts "
            "(its RunnerConfig.max_draft_tokens is 0)"
        )
    if num_draft_tokens > rc.max_draft_tokens:
        raise ValueError(
            f"num_draft_tokens={num_draft_tokens} exceeds the runner's max_draft_tokens="
            f"{rc.max_draft_tokens}"
        )
    if not all(g.rewinds(num_draft_tokens) for g in rc.cache_groups):
        raise ValueError(
            "speculative decoding is not supported for runners with State cache groups "
            f"that cannot drop {num_draft_tokens} rejected draft tokens (a recurrent state "
            "would need a checkpoint after every draft token to roll back)"
        )
