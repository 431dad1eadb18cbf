"""Batched sampling on the device: greedy, temperature, top-k, top-p, min-p, per-row seeds.

Filtering follows vLLM's order: temperature, then top-k, then top-p (smallest set whose mass
reaches p; the most likely token always stays), then min-p (drop tokens below min_p times the
top probability). A token is drawn by the exponential race (argmax of p / E, E ~ Exp(1)), with
one noise value per *vocabulary id*: a seeded row's noise comes from a generator seeded by
(seed, output_index) alone, so the row draws the same token whatever batch it sits in.

A temperature below `GREEDY_TEMPERATURE` is greedy (a tinier divisor overflows float32).
Penalties (`penalties.py`) change the logits after mask and bias; the sampler keeps the
token counts and counts each penalized row's sampled token.

Logprobs are those of the model's logits after the request's constraint mask, logit bias
(`constrain_logits`: disallowed tokens are -inf, so they get logprob -inf) and penalties, and
before temperature or filtering: what the request could sample from, at temperature 1. vLLM
reports grammar-masked logprobs the same way; see docs/constraints.md.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from resin.params import GREEDY_TEMPERATURE
from resin.plan import SamplingArrays
from resin_model.constraints import constrain_logits
from resin_model.penalties import TokenCounts, penalize

_MASK64 = (1 << 64) - 1


@dataclass(frozen=True, slots=True)
class SampleResult:
    """Device tensors for N sampled rows; `top_*` are None when no row asked for top-k."""

    token_ids: torch.Tensor  # [N] long
    logprobs: torch.Tensor  # [N] float32
    top_ids: torch.Tensor | None  # [N, K] long
    top_logprobs: torch.Tensor | None  # [N, K] float32


def row_seed(seed: int, output_index: int) -> int:
    """A 63-bit generator seed from (seed, output_index) (splitmix64 finaliser)."""
    z = (seed * 0x9E3779B97F4A7C15 + output_index + 1) & _MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
    return (z ^ (z >> 31)) >> 1


class Sampler:
    """Samples one token per row of a [N, V] float32 logits tensor."""

    def __init__(self, device: torch.device, seed: int = 0) -> None:
        self.device = device
        self.generator = torch.Generator(device=device)
        self.generator.manual_seed(seed)
        self.counts = TokenCounts(device)

    def sample(
        self,
        logits: torch.Tensor,
        params: SamplingArrays,
        rows: np.ndarray,
        output_offset: np.ndarray | None = None,
    ) -> SampleResult:
        """`rows` selects the plan rows (into `params`) that `logits` belong to, in order (a
        row may repeat: speculative verification samples each of a row's query tokens).
        `output_offset` [N] is added to the row's `output_index` for seeding (the j-th query
        token of a draft row draws for output position output_index + j)."""
        logits = constrain_logits(logits, params, rows)
        if params.penalized:
            logits = penalize(logits, params, rows, self.counts)
        logprobs_all = torch.log_softmax(logits.float(), dim=-1)
        temperature = params.temperature[rows]
        top_k = params.top_k[rows]
        greedy = (temperature < GREEDY_TEMPERATURE) | (top_k == 1)
        if bool(greedy.all()):
            tokens = logits.argmax(dim=-1)
        else:
            tokens = self._draw(logits.float(), params, rows, greedy, output_offset)
        if params.penalized:
            self.counts.record(params, rows, tokens)
        chosen = logprobs_all.gather(1, tokens[:, None])[:, 0]
        k = int(params.logprobs[rows].max(initial=-1))
        if k <= 0:
            return SampleResult(tokens, chosen, None, None)
        top_lp, top_ids = logprobs_all.topk(min(k, logits.shape[1]), dim=-1)
        return SampleResult(tokens, chosen, top_ids, top_lp)

    def _draw(
        self,
        logits: torch.Tensor,
        params: SamplingArrays,
        rows: np.ndarray,
        greedy: np.ndarray,
        output_offset: np.ndarray | None,
    ) -> torch.Tensor:
        n, vocab = logits.shape
        dev = logits.device
        temperature = np.where(greedy, 1.0, params.temperature[rows]).astype(np.float32)
        top_k = params.top_k[rows].astype(np.int64)
        top_k = np.where(top_k > 0, np.minimum(top_k, vocab), vocab)
        scaled = logits / torch.from_numpy(temperature).to(dev)[:, None]
        sorted_logits, order = scaled.sort(dim=-1, descending=True)
        rank = torch.arange(vocab, device=dev)[None, :]
        drop = rank >= torch.from_numpy(top_k).to(dev)[:, None]
        sorted_logits = sorted_logits.masked_fill(drop, float("-inf"))
        probs = torch.softmax(sorted_logits, dim=-1)
        top_p = torch.from_numpy(params.top_p[rows].astype(np.float32)).to(dev)
        mass_before = probs.cumsum(dim=-1) - probs
        drop |= mass_before >= top_p[:, None]
        min_p = torch.from_numpy(params.min_p[rows].astype(np.float32)).to(dev)
        drop |= probs < min_p[:, None] * probs[:, :1]
        drop[:, 0] = False
        probs = torch.softmax(sorted_logits.masked_fill(drop, float("-inf")), dim=-1)
        probs_by_id = torch.zeros_like(probs).scatter_(1, order, probs)
        output_index = params.output_index[rows].astype(np.int64)
        if output_offset is not None:
            output_index = output_index + output_offset
        noise = self._noise(n, vocab, params.seed[rows], output_index)
        sampled = (probs_by_id / noise).argmax(dim=-1)
        return torch.where(torch.from_numpy(greedy).to(dev), logits.argmax(dim=-1), sampled)

    def _noise(
        self, n: int, vocab: int, seeds: np.ndarray, output_index: np.ndarray
    ) -> torch.Tensor:
        """Exp(1) noise [n, V]; seeded rows use their own (seed, output_index) generator."""
        uniform = torch.empty(n, vocab, device=self.device)
        for i in range(n):
            if seeds[i] >= 0:
                gen = torch.Generator(device=self.device)
                gen.manual_seed(row_seed(int(seeds[i]), int(output_index[i])))
                uniform[i].uniform_(generator=gen)
            else:
                uniform[i].uniform_(generator=self.generator)
        return -torch.log(uniform.clamp_(min=torch.finfo(torch.float32).tiny))
