"""A reserved cohort -> the frozen `BatchPlan`, as a pure function of its inputs.

Decode rows are gathers from the `SlotStore` (last token, sampling policy, output count); a
prefill plan concatenates one token slice per request. The query layout and the cache rows
come with the `ReservedCohort` the scheduler returned. No Python loop per token anywhere, and
nothing here writes engine state.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from resin.engine.media import plan_media
from resin.engine.penalties import count_resets
from resin.engine.request import Request
from resin.engine.scheduler import ReservedCohort
from resin.engine.slots import SlotStore
from resin.plan import BatchPlan, Phase

I32 = npt.NDArray[np.int32]

_EMPTY_I32 = np.zeros(0, dtype=np.int32)
_EMPTY_I32.flags.writeable = False


def build_plan(
    step_id: int,
    reserved: ReservedCohort,
    slot_store: SlotStore,
    prev_token_rows: I32 | None = None,
) -> BatchPlan:
    """The plan for the cohort's rows computing positions `cached[i] .. totals[i] - 1`.

    `prev_token_rows` (decode, overlap: `engine/pipeline.py`): rows >= 0 take their input
    token on the device.
    """
    cohort = reserved.cohort
    phase, requests, cached, totals = cohort.phase, cohort.requests, cohort.cached, cohort.totals
    slots, query_indptr = cohort.slots, reserved.query_indptr
    b = slots.size
    if phase is Phase.DECODE:
        input_ids = slot_store.last_token[slots]
        if prev_token_rows is not None:
            input_ids[prev_token_rows >= 0] = -1
        sample_rows = np.ones(b, dtype=np.bool_)
        prompt_rows = np.zeros(b, dtype=np.bool_)
        target_ids = np.full(b, -1, dtype=np.int32)
        prompt_k = resets = None
    else:
        t = int(query_indptr[-1])
        input_ids = np.concatenate(
            [
                r.token_array(e)[c:e]
                for r, c, e in zip(requests, cached.tolist(), totals.tolist(), strict=True)
            ]
        )
        known = np.fromiter((r.num_tokens for r in requests), dtype=np.int32, count=b)
        sample_rows = totals == known
        resets = count_resets(requests, sample_rows)
        prompt_rows = np.fromiter(
            (r.prompt_lp is not None and not r.started for r in requests),
            dtype=np.bool_,
            count=b,
        )
        target_ids = np.full(t, -1, dtype=np.int32)
        prompt_k = None
        if prompt_rows.any():
            target_ids = _targets(requests, cached, totals, prompt_rows, t)
            prompt_k = np.fromiter(
                (_prompt_k(r, w) for r, w in zip(requests, prompt_rows.tolist(), strict=True)),
                dtype=np.int32,
                count=b,
            )
    return BatchPlan(
        step_id=step_id,
        phase=phase,
        sequence_ids=slot_store.seq_id[slots],
        input_ids=input_ids,
        query_indptr=query_indptr,
        positions=reserved.positions,
        cached_lens=cached,
        total_lens=totals,
        sample_rows=sample_rows,
        sampling=slot_store.sampling(slots, prompt_k, resets),
        cache_groups=reserved.cache_groups,
        prompt_logprob_rows=prompt_rows,
        target_ids=target_ids,
        draft_indptr=np.zeros(b + 1, dtype=np.int32),
        draft_ids=_EMPTY_I32,
        media=plan_media([r.media for r in requests], totals),
        prev_token_rows=_EMPTY_I32 if prev_token_rows is None else prev_token_rows,
    )


def _targets(
    requests: tuple[Request, ...], cached: I32, totals: I32, rows: npt.NDArray[np.bool_], t: int
) -> I32:
    """Next known token after each query token of the prompt-logprob rows (-1 elsewhere)."""
    parts = []
    for r, c, e, want in zip(
        requests, cached.tolist(), totals.tolist(), rows.tolist(), strict=True
    ):
        if not want:
            parts.append(np.full(e - c, -1, dtype=np.int32))
            continue
        nxt = r.token_array(r.num_tokens)[c + 1 : min(e + 1, r.num_tokens)]
        parts.append(np.concatenate([nxt, np.full(e - c - nxt.size, -1, dtype=np.int32)]))
    out = np.concatenate(parts) if parts else np.zeros(0, dtype=np.int32)
    assert out.size == t
    return out.astype(np.int32, copy=False)


def _prompt_k(request: Request, wanted: bool) -> int:
    k = request.sampling_params.prompt_logprobs
    return -1 if not wanted or k is None else k
