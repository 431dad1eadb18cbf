"""Check a runner's `ForwardOutput` against the plan it answers (vectorized).

A failed check is a message, not an exception: the engine quarantines the plan's requests and
goes on. Nothing here mutates engine state.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from resin.plan import BatchPlan, ForwardOutput


def validate_output(plan: BatchPlan, out: ForwardOutput, vocab_size: int | None) -> str | None:
    """None when `out` is a valid answer to `plan`, else what is wrong."""
    b = plan.num_sequences
    if not isinstance(out, ForwardOutput):
        return f"runner returned {type(out).__name__}, expected ForwardOutput"
    ids, indptr = np.asarray(out.token_ids), np.asarray(out.token_indptr)
    if ids.ndim != 1 or indptr.shape != (b + 1,):
        return f"token_ids must be [N] and token_indptr [{b + 1}], got {ids.shape} / {indptr.shape}"
    if not (np.issubdtype(ids.dtype, np.integer) and np.issubdtype(indptr.dtype, np.integer)):
        return "token_ids / token_indptr must be integer arrays"
    indptr = indptr.astype(np.int64)
    counts = np.diff(indptr)
    if indptr[0] != 0 or indptr[-1] != ids.size or (counts < 0).any():
        return "token_indptr must start at 0, be non-decreasing and end at len(token_ids)"
    drafts = np.diff(plan.draft_indptr)
    expected = np.where(plan.sample_rows, 1 + drafts, 0)
    if (counts > expected).any() or (counts[plan.sample_rows] < 1).any():
        bad = int(np.flatnonzero((counts > expected) | (plan.sample_rows & (counts < 1)))[0])
        return f"row {bad} returned {int(counts[bad])} tokens, expected {int(expected[bad])}"
    if ids.size and (
        int(ids.min()) < 0 or (vocab_size is not None and int(ids.max()) >= vocab_size)
    ):
        return f"token id out of range [0, {vocab_size})"
    n = ids.size
    want = plan.sampling.logprobs[plan.sample_rows]
    if want.size and int(want.max()) >= 0:
        k = int(want.max())
        if out.logprobs is None or np.asarray(out.logprobs).shape != (n,):
            return f"logprobs were asked for: expected logprobs of shape ({n},)"
        if k > 0 and not _has_top(out.top_ids, out.top_logprobs, n, k):
            return (
                f"top logprobs were asked for: expected top_ids/top_logprobs of shape ({n}, >={k})"
            )
    drafted = _check_drafts(out, counts, vocab_size)
    if drafted is not None:
        return drafted
    if plan.prompt_logprob_rows.any():
        t = plan.num_tokens
        if out.prompt_logprobs is None or np.asarray(out.prompt_logprobs).shape != (t,):
            return f"prompt logprobs were asked for: expected prompt_logprobs of shape ({t},)"
    return None


def _check_drafts(
    out: ForwardOutput, counts: npt.NDArray[np.int64], vocab_size: int | None
) -> str | None:
    """`draft_ids` / `draft_indptr`: both or neither, CSR over the rows, ids in range, none on
    a row that returned no token."""
    if out.draft_ids is None and out.draft_indptr is None:
        return None
    if out.draft_ids is None or out.draft_indptr is None:
        return "draft_ids and draft_indptr come together"
    ids, indptr = np.asarray(out.draft_ids), np.asarray(out.draft_indptr)
    if ids.ndim != 1 or indptr.shape != (counts.size + 1,):
        return f"draft_ids must be [D] and draft_indptr [{counts.size + 1}]"
    if not (np.issubdtype(ids.dtype, np.integer) and np.issubdtype(indptr.dtype, np.integer)):
        return "draft_ids / draft_indptr must be integer arrays"
    per_row = np.diff(indptr.astype(np.int64))
    if indptr[0] != 0 or int(indptr[-1]) != ids.size or (per_row < 0).any():
        return "draft_indptr must start at 0, be non-decreasing and end at len(draft_ids)"
    if ((per_row > 0) & (counts == 0)).any():
        return "a row that returned no token proposed drafts"
    top = vocab_size if vocab_size is not None else np.iinfo(np.int64).max
    if ids.size and (int(ids.min()) < 0 or int(ids.max()) >= top):
        return f"draft id out of range [0, {vocab_size})"
    return None


def _has_top(ids: object, lps: object, n: int, k: int) -> bool:
    if ids is None or lps is None:
        return False
    a, b = np.asarray(ids), np.asarray(lps)
    return a.ndim == 2 and a.shape == b.shape and a.shape[0] == n and a.shape[1] >= k
