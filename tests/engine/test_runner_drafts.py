"""Drafts a runner proposes with its output (`ForwardOutput.draft_ids`, multi-token prediction)
travel through the engine: validated with the output, kept with the request at commit
(`Request.drafts`) and offered back by `MtpProposer`; outputs stay those of the naive loop
whatever the drafts are. Invalid drafts quarantine the step like any invalid output."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pytest

from resin import BatchPlan, Engine, FinishReason, ForwardOutput, History, SamplingParams
from resin.engine.proposers import MtpProposer
from resin.engine.speculative import Speculation
from resin.engine.transaction import out_rows
from tests.engine.fakes import naive_generate, next_token
from tests.engine.spec_fakes import SpecCacheSimRunner

VOCAB = 30
GROUPS = (History(),)


@dataclass
class DraftingRunner(SpecCacheSimRunner):
    """Returns, with each row's tokens, the fake model's true continuation as the drafts for
    the row's next step (an MTP head that is always right), except on every third step, whose
    drafts are shifted (wrong). Checks that a verify step's drafts are a prefix of what it
    proposed for that sequence."""

    num_drafts: int = 3
    seqs: dict[int, list[int]] = field(default_factory=dict)
    proposed: dict[int, list[int]] = field(default_factory=dict)
    verify_rows: int = 0

    def forward(self, plan: BatchPlan) -> ForwardOutput:
        for i in range(plan.num_sequences):
            lo, hi = int(plan.draft_indptr[i]), int(plan.draft_indptr[i + 1])
            if hi > lo:
                sid = int(plan.sequence_ids[i])
                want = self.proposed[sid][: hi - lo]
                assert plan.draft_ids[lo:hi].tolist() == want
                self.verify_rows += 1
        out = super().forward(plan)
        counts = np.diff(out.token_indptr.astype(np.int64))
        drafts: list[int] = []
        indptr = [0]
        for i in range(plan.num_sequences):
            sid = int(plan.sequence_ids[i])
            q_lo, q_hi = int(plan.query_indptr[i]), int(plan.query_indptr[i + 1])
            tokens = self.seqs.setdefault(sid, [])
            del tokens[int(plan.positions[q_lo]) :]
            drafted = int(plan.draft_indptr[i + 1] - plan.draft_indptr[i])
            tokens.extend(plan.input_ids[q_lo : q_hi - drafted].tolist())
            o_lo = int(out.token_indptr[i])
            tokens.extend(out.token_ids[o_lo : o_lo + counts[i]].tolist())
            if counts[i]:
                chain = list(tokens)
                for _ in range(self.num_drafts):
                    chain.append(next_token(self.groups, chain, 0, self.vocab))
                row = chain[len(tokens) :]
                if plan.step_id % 3 == 0:
                    row = [(t + 1) % self.vocab for t in row]
                self.proposed[sid] = row
                drafts += row
            indptr.append(len(drafts))
        return ForwardOutput(
            out.token_ids,
            out.token_indptr,
            draft_ids=np.asarray(drafts, dtype=np.int32),
            draft_indptr=np.asarray(indptr, dtype=np.int32),
        )


def test_drafts_from_the_output_are_verified_and_exact() -> None:
    runner = DraftingRunner(groups=GROUPS, num_pages=64, vocab=VOCAB)
    engine = Engine(
        runner,
        context_length=64,
        max_batch_tokens=40,
        prefill_chunk_tokens=6,
        speculation=Speculation(MtpProposer(), 3),
    )
    prompts = [[3, 1, 4, 1, 5, 9, 2, 6], [2, 7, 1, 8], [1, 1, 2, 3, 5, 8, 13, 21, 4, 7]]
    params = [
        SamplingParams(max_output_tokens=20),
        SamplingParams(max_output_tokens=11),
        SamplingParams(max_output_tokens=17, stop_token_ids=[4]),
    ]
    handles = [engine.submit(p, s) for p, s in zip(prompts, params, strict=True)]
    while engine.has_work():
        engine.step()
        engine.check_invariants()
    for h, p, s in zip(handles, prompts, params, strict=True):
        assert (h.take_result(), h.finish_reason) == naive_generate(GROUPS, p, s, VOCAB, 64)
    assert runner.verify_rows > 5
    assert any(d == a > 0 for d, a in runner.verified)  # right drafts all accepted
    assert any(d > 0 and a < d for d, a in runner.verified)  # shifted ones rejected


def test_stale_drafts_are_not_offered() -> None:
    runner = DraftingRunner(groups=GROUPS, num_pages=64, vocab=VOCAB)
    engine = Engine(runner, context_length=64)  # no speculation: drafts are only kept
    handle = engine.submit([3, 1, 4, 1], SamplingParams(max_output_tokens=3))
    engine.step()  # the prefill: its token plus drafts to follow it
    num_tokens, drafts = handle.drafts
    assert num_tokens == handle.num_tokens == 5 and len(drafts) == 3
    assert MtpProposer().propose([handle], [2]) == [list(drafts[:2])]
    engine.step()  # a plain decode step: new drafts for the longer sequence
    assert handle.drafts[0] == handle.num_tokens == 6
    stale = (handle.num_tokens - 1, drafts)
    handle.drafts = stale  # as if this step's output had proposed none
    assert MtpProposer().propose([handle], [2]) == [[]]


@pytest.mark.parametrize(
    ("ids", "indptr", "problem"),
    [
        ([1, 2], [0, 2], "draft_ids and draft_indptr come together"),
        ([1, VOCAB], [0, 2], "draft id out of range"),
        ([1], [0, 1, 1], "draft_ids must be [D] and draft_indptr [2]"),
        ([1, 2], [0, 1], "draft_indptr must start at 0"),
    ],
)
def test_invalid_drafts_quarantine_the_step(
    ids: list[int], indptr: list[int], problem: str
) -> None:
    @dataclass
    class BadDrafts(SpecCacheSimRunner):
        def forward(self, plan: BatchPlan) -> ForwardOutput:
            out = super().forward(plan)
            if problem.startswith("draft_ids and"):
                return ForwardOutput(out.token_ids, out.token_indptr, draft_ids=np.array(ids))
            return ForwardOutput(
                out.token_ids,
                out.token_indptr,
                draft_ids=np.asarray(ids, dtype=np.int32),
                draft_indptr=np.asarray(indptr, dtype=np.int32),
            )

    engine = Engine(BadDrafts(groups=GROUPS, num_pages=64, vocab=VOCAB), context_length=64)
    handle = engine.submit([3, 1, 4, 1], SamplingParams(max_output_tokens=3))
    while engine.has_work():
        engine.step()
    assert handle.finish_reason is FinishReason.ERROR
    assert handle.error is not None and problem in handle.error
    engine.check_invariants()


def test_an_overlapped_commit_of_fewer_rows_keeps_their_drafts() -> None:
    """Rows of requests that left while a plan was in flight are dropped at collection
    (`engine/pipeline.py`); the kept rows keep their own proposed drafts."""
    out = ForwardOutput(
        np.asarray([5, 6, 7], dtype=np.uint32),
        np.arange(4, dtype=np.uint32),
        draft_ids=np.asarray([1, 2, 3, 4, 8, 9], dtype=np.int32),
        draft_indptr=np.asarray([0, 2, 4, 6], dtype=np.int32),
    )
    part = out_rows(out, np.asarray([True, False, True]))
    assert part.token_ids.tolist() == [5, 7]
    assert part.draft_ids is not None and part.draft_indptr is not None
    assert part.draft_ids.tolist() == [1, 2, 8, 9]
    assert part.draft_indptr.tolist() == [0, 2, 4]
    plain = out_rows(ForwardOutput(out.token_ids, out.token_indptr), np.asarray([0, 1, 1], bool))
    assert plain.draft_ids is None and plain.token_ids.tolist() == [6, 7]
