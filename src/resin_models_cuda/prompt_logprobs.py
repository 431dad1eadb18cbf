"""Prompt logprobs: the logprob of each next prompt token, and the top-k alternatives a row
asks for (`SamplingParams.prompt_logprobs`; `echo` + `logprobs` on `/v1/completions`).

They come from the raw model logits (no mask, bias, temperature or filter), the distribution
the reference runner reports too. Only the query tokens that need one go through the LM head:
those of the plan's `prompt_logprob_rows` whose next token is known (`target_ids >= 0`), so a
chunked prefill's last token (its target is the next chunk's first token) counts and a row's
last known token does not. They run through the head in chunks of at most `ELEMENTS` logits,
so a long prompt never holds [T, V] float32 at once. Everything stays on the device until the
step's `collect`, whose wait for the tokens covers these kernels too.

Plans without prompt-logprob rows never reach this module: decode graphs and ordinary
prefills do no extra work.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

import numpy as np
import torch

from resin.plan import BatchPlan, ForwardOutput

ELEMENTS = 1 << 25
"""Most logits one chunk holds (128 MiB of float32): 256 tokens of a 128k vocabulary."""


@dataclass(frozen=True, slots=True)
class PromptLogprobs:
    """One step's prompt logprobs on the device: entry n is flat query token `tokens[n]`."""

    num_tokens: int  # T of the plan
    tokens: np.ndarray  # int64 [N]
    chosen: torch.Tensor  # float32 [N]: logprob of the token's target
    top_ids: torch.Tensor | None  # int64 [N, K] (None: no row asked for alternatives)
    top_logprobs: torch.Tensor | None  # float32 [N, K]

    def attach(self, out: ForwardOutput) -> ForwardOutput:
        """`out` with the prompt fields: [T] and [T, K] arrays, NaN / -1 where not computed."""
        t, tokens = self.num_tokens, self.tokens
        chosen = np.full(t, np.nan, dtype=np.float32)
        chosen[tokens] = self.chosen.cpu().numpy()
        if self.top_ids is None or self.top_logprobs is None:
            return replace(out, prompt_logprobs=chosen)
        k = self.top_ids.shape[1]
        ids = np.full((t, k), -1, dtype=np.int32)
        lps = np.full((t, k), np.nan, dtype=np.float32)
        ids[tokens] = self.top_ids.cpu().numpy()
        lps[tokens] = self.top_logprobs.cpu().numpy()
        return replace(out, prompt_logprobs=chosen, prompt_top_ids=ids, prompt_top_logprobs=lps)


def prompt_tokens(plan: BatchPlan) -> np.ndarray:
    """Flat query tokens whose prompt logprob the plan asks for (int64, ascending)."""
    token_rows = np.repeat(np.arange(plan.num_sequences), plan.query_lens)
    wanted = plan.prompt_logprob_rows[token_rows] & (plan.target_ids >= 0)
    return np.flatnonzero(wanted).astype(np.int64)


def top_k(plan: BatchPlan) -> int:
    """Alternatives per token: the largest `prompt_logprobs` of the rows that ask."""
    column = plan.sampling.prompt_logprobs
    if not column.size:
        return 0
    return max(0, int(np.max(np.where(plan.prompt_logprob_rows, column, -1), initial=-1)))


def prompt_logprobs(
    plan: BatchPlan,
    hidden: torch.Tensor | None,
    logits_of: Callable[[torch.Tensor], torch.Tensor],
    vocab: int,
    elements: int | None = None,
) -> PromptLogprobs:
    """Prompt logprobs of `plan` from the step's final hidden states [T, H] through the LM
    head `logits_of` (`hidden` may be None when no token needs one: a decode row's target is
    never known)."""
    tokens = prompt_tokens(plan)
    if not tokens.size:
        return PromptLogprobs(plan.num_tokens, tokens, torch.zeros(0), None, None)
    assert hidden is not None, "prompt logprobs need the step's hidden states"
    k = min(top_k(plan), vocab)
    index = torch.from_numpy(tokens).to(hidden.device)
    targets = torch.from_numpy(plan.target_ids[tokens].astype(np.int64)).to(hidden.device)
    step = max(1, (elements or ELEMENTS) // vocab)
    chosen, top_ids, top_lps = [], [], []
    for lo in range(0, tokens.size, step):
        logp = torch.log_softmax(logits_of(hidden[index[lo : lo + step]]), dim=-1)
        chosen.append(logp.gather(1, targets[lo : lo + step, None]).squeeze(1))
        if k:
            values, ids = logp.topk(k, dim=-1)
            top_lps.append(values)
            top_ids.append(ids)
    return PromptLogprobs(
        plan.num_tokens,
        tokens,
        torch.cat(chosen),
        torch.cat(top_ids) if k else None,
        torch.cat(top_lps) if k else None,
    )
