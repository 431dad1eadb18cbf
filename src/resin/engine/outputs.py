"""Turn a validated `ForwardOutput` row into what a `TokensEvent` carries (logprobs)."""

from __future__ import annotations

import numpy as np

from resin.engine.request import PromptLogprobs
from resin.events import TopLogprob
from resin.plan import BatchPlan, ForwardOutput


def token_logprobs(
    out: ForwardOutput, k_index: int, want: int
) -> tuple[tuple[float, ...], tuple[tuple[TopLogprob, ...], ...] | None]:
    """The chosen token's logprob and (when `want` > 0) its top-`want` alternatives."""
    assert out.logprobs is not None
    lp = (float(out.logprobs[k_index]),)
    if want <= 0 or out.top_ids is None or out.top_logprobs is None:
        return lp, None
    ids = out.top_ids[k_index, :want].tolist()
    lps = out.top_logprobs[k_index, :want].tolist()
    return lp, (tuple(TopLogprob(int(i), float(v)) for i, v in zip(ids, lps, strict=True)),)


def collect_prompt_logprobs(
    acc: PromptLogprobs, k: int, plan: BatchPlan, out: ForwardOutput, row: int
) -> None:
    """Append row `row`'s prompt-token logprobs (targets known) and, for `k` > 0, their
    top-`k` alternatives to `acc`."""
    if out.prompt_logprobs is None:
        return
    lo, hi = int(plan.query_indptr[row]), int(plan.query_indptr[row + 1])
    known = np.flatnonzero(plan.target_ids[lo:hi] >= 0) + lo
    acc.values.extend(np.asarray(out.prompt_logprobs)[known].tolist())
    if k <= 0:
        return
    ids, lps = out.prompt_top_ids, out.prompt_top_logprobs
    if ids is None or lps is None:
        return
    ids, lps = np.asarray(ids), np.asarray(lps)
    want = (plan.num_tokens, k)
    if ids.ndim != 2 or ids.shape != lps.shape or ids.shape[0] != want[0] or ids.shape[1] < k:
        return  # prompt alternatives are optional: a runner without them gives none
    for t in known.tolist():
        acc.top.append(
            tuple(
                TopLogprob(int(i), float(v))
                for i, v in zip(ids[t, :k].tolist(), lps[t, :k].tolist(), strict=True)
            )
        )
