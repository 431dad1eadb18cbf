"""Speculative verification in plain torch on any device (the reference runner's; `CudaRunner`
samples every query token on the device, `resin_models_cuda.sampling`, under the same rule).

A decode row with k drafts d_0..d_{k-1} has 1 + k query tokens; the logits after query token j
give the target distribution p_j of output position m = output_index + j. Verification:

1. Sample one token x_j from every p_j (the row's mask, bias, temperature, top-k, top-p and
   min-p applied; greedy rows take the argmax), drawing for output position m exactly as a
   non-speculative step would: a seeded row's randomness comes from (seed, m) only.
2. Accept drafts while d_j == x_j; the row returns x_0..x_a, where a is the number of leading
   matches: the accepted drafts (equal to the samples) plus one more token, the correction at
   the first mismatch or the bonus after the last draft.

Because the drafts are deterministic proposals (q = a point mass on d_j), this is the standard
rejection rule: d_j is accepted with probability p_j(d_j), and at the first rejection x_j is a
draw from p_j conditioned on x_j != d_j, i.e. p_j with d_j removed and renormalized. It also
makes a seeded row's tokens identical with and without speculation (greedy rows trivially so).

`accept_first` (bench only: `resin bench speculative --accepted-drafts K`) forces the first K
drafts of each row to be accepted whatever the model says, so a benchmark can measure the cost
of verifying and committing K tokens per step independently of draft quality. Its output is
not the model's.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from resin.plan import BatchPlan, ForwardOutput
from resin_model.constraints import constrain_logits
from resin_models_torch.sampler import Sampler


@dataclass(frozen=True, slots=True)
class DraftLayout:
    """Host-side view of the N query tokens whose logits a plan's sampling rows need.

    Sampling row i contributes its last k_i + 1 query tokens (k_i = its drafts; 0 for a row
    without drafts, so only its last token), in row order.
    - `token_index` int64 [N]: flat query-token index (into `plan.input_ids` / the hidden states);
    - `token_rows` int64 [N]: plan row of each;
    - `offsets` int64 [N]: j, the token's place in its row (it samples output position
      `output_index + j`);
    - `drafts` int64 [N]: the draft d_j each sample is compared with (-1 after the last draft);
    - `num_drafts` int64 [B]: k_i per plan row (0 for rows that do not sample).
    """

    token_index: np.ndarray
    token_rows: np.ndarray
    offsets: np.ndarray
    drafts: np.ndarray
    num_drafts: np.ndarray


def draft_layout(plan: BatchPlan) -> DraftLayout:
    """Which query tokens to take logits from, and what each is compared with."""
    b = plan.num_sequences
    if plan.draft_indptr.size:
        k = np.diff(plan.draft_indptr).astype(np.int64)
    else:
        k = np.zeros(b, dtype=np.int64)
    k = np.where(plan.sample_rows, k, 0)
    if np.any(k >= plan.query_lens):
        raise ValueError("a draft row needs 1 + k query tokens")
    rows = np.nonzero(plan.sample_rows)[0].astype(np.int64)
    counts = k[rows] + 1
    token_rows = np.repeat(rows, counts)
    starts = np.cumsum(counts) - counts
    offsets = np.arange(int(counts.sum()), dtype=np.int64) - np.repeat(starts, counts)
    first = plan.query_indptr[1:][rows].astype(np.int64) - counts
    token_index = np.repeat(first, counts) + offsets
    has_draft = offsets < k[token_rows]
    nxt = np.minimum(token_index + 1, max(plan.num_tokens - 1, 0))
    drafts = np.where(has_draft, plan.input_ids[nxt].astype(np.int64), -1)
    return DraftLayout(token_index, token_rows, offsets, drafts, k)


def accept(
    sampled: torch.Tensor, layout: DraftLayout, accept_first: int | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """(tokens [N], keep [N] bool) on the device, without a host sync.

    `sampled` [N] holds x_j for every layout token. A row keeps its tokens up to and including
    the first whose draft does not match (or its last). With `accept_first` = K (bench only),
    the first min(k_i, K) drafts are accepted and returned as the row's tokens regardless.
    """
    dev = sampled.device
    drafts = torch.from_numpy(layout.drafts).to(dev)
    tokens = sampled.long()
    if accept_first is not None:
        limit = np.minimum(layout.num_drafts, accept_first)[layout.token_rows]
        tokens = torch.where(torch.from_numpy(layout.offsets < limit).to(dev), drafts, tokens)
    # Exclusive running count of mismatches; a token is kept when its row saw none before it
    # (the row's first token sits `offsets` places back).
    miss = (tokens != drafts).long()
    before = miss.cumsum(0) - miss
    n = int(layout.offsets.shape[0])
    first = torch.from_numpy(np.arange(n, dtype=np.int64) - layout.offsets).to(dev)
    keep = before == before[first]
    return tokens, keep


@dataclass(frozen=True, slots=True)
class VerifyResult:
    """Device tensors over the N layout tokens; `keep` marks the ones a row returns."""

    tokens: torch.Tensor  # [N] long
    keep: torch.Tensor  # [N] bool
    logprobs: torch.Tensor  # [N] float32
    top_ids: torch.Tensor | None  # [N, K] long
    top_logprobs: torch.Tensor | None  # [N, K] float32

    def to_output(self, plan: BatchPlan, layout: DraftLayout) -> ForwardOutput:
        """The plan's `ForwardOutput`: one host transfer, then the kept tokens flattened."""
        keep = self.keep.cpu().numpy()
        counts = np.bincount(layout.token_rows[keep], minlength=plan.num_sequences)
        indptr = np.concatenate(([0], np.cumsum(counts))).astype(np.uint32)
        wants = int(plan.sampling.logprobs[plan.sample_rows].max(initial=-1))
        top_ids = top_lp = None
        if self.top_ids is not None and self.top_logprobs is not None:
            top_ids = self.top_ids.cpu().numpy()[keep].astype(np.int32)
            top_lp = self.top_logprobs.cpu().numpy()[keep].astype(np.float32)
        return ForwardOutput(
            token_ids=self.tokens.cpu().numpy()[keep].astype(np.uint32),
            token_indptr=indptr,
            logprobs=self.logprobs.cpu().numpy()[keep].astype(np.float32) if wants >= 0 else None,
            top_ids=top_ids,
            top_logprobs=top_lp,
        )


def verify(
    logits: torch.Tensor,
    plan: BatchPlan,
    layout: DraftLayout,
    sampler: Sampler,
    accept_first: int | None = None,
) -> VerifyResult:
    """Verify a plan's drafts from `logits` [N, V] (raw model logits at `layout.token_index`;
    the sampler applies the plan's mask and biases itself)."""
    params = plan.sampling
    result = sampler.sample(logits, params, layout.token_rows, layout.offsets)
    tokens, keep = accept(result.token_ids, layout, accept_first)
    logprobs = result.logprobs
    if accept_first is not None and int(params.logprobs[layout.token_rows].max(initial=-1)) >= 0:
        processed = constrain_logits(logits, params, layout.token_rows)
        logprobs = torch.log_softmax(processed.float(), dim=-1).gather(1, tokens[:, None])[:, 0]
    return VerifyResult(tokens, keep, logprobs, result.top_ids, result.top_logprobs)
