"""Turning a step's logits into tokens on the device, and the step's one read-back.

`pick` is the one place that samples: logits row n belongs to plan row `rows[n]` and samples output
position `output_index + offsets[n]` (offsets > 0 for a verify row's later query tokens, so a seeded
row draws exactly what a non-speculative run draws there). Greedy steps take the argmax the decode
graph already computed (unless a mask, bias or penalty changed the logits; a temperature below
`GREEDY_TEMPERATURE` is greedy). Penalized rows read and update their token counts on the device
(`TokenCounts`, `kernels/penalties.py`). Nothing here syncs with the host: the tokens go to a pinned
host buffer with one non-blocking copy and an event (`Picked`), and `Picked.wait()` is the step's
only sync, done by `collect()`.

`speculative_output` turns a verify plan's tokens into the `ForwardOutput`: every query token
of a row sampled x_j; the row returns x_0..x_a with a the number of leading drafts equal to
their x_j (greedy: the argmax; sampling with deterministic proposals, this is the exact
rejection rule, see `docs/engine.md`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from resin.params import GREEDY_TEMPERATURE
from resin.plan import BatchPlan, ForwardOutput, SamplingArrays
from resin_model.constraints import constrain_logits
from resin_model.penalties import TokenCounts
from resin_models_cuda.kernels.penalties import apply_penalties
from resin_models_cuda.kernels.sampler import argmax_rows, philox_seeds, sample_tokens


@dataclass(frozen=True, slots=True)
class Picked:
    """One step's device results on their way to the host."""

    tokens: torch.Tensor  # int32 [N] device
    host: torch.Tensor  # int32 pinned (or plain on CPU) [>= N], filled by the copy
    event: torch.cuda.Event | None
    logprobs: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None  # chosen, top ids, top lp
    asked: np.ndarray | None  # logprobs asked per logits row

    def wait(self) -> np.ndarray:
        """The tokens on the host (blocks until the step's copy is done)."""
        if self.event is not None:
            self.event.synchronize()  # type: ignore[no-untyped-call]
        return self.host[: self.tokens.shape[0]].numpy().copy()

    def host_logprobs(self) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
        if self.logprobs is None or self.asked is None:
            return None
        chosen, top_ids, top_lp = self.logprobs
        lp = np.where(self.asked >= 0, chosen.cpu().numpy(), np.nan).astype(np.float32)
        return lp, top_ids.to(torch.int32).cpu().numpy(), top_lp.cpu().numpy().astype(np.float32)


class ReadBack:
    """Two pinned host buffers for token read-back, alternating (at most two steps in flight)."""

    def __init__(self, size: int, device: torch.device) -> None:
        self._pinned = device.type == "cuda"
        self._bufs = [self._new(size), self._new(size)]
        self._turn = 0

    def _new(self, size: int) -> torch.Tensor:
        return torch.empty(size, dtype=torch.int32, pin_memory=self._pinned)

    def send(self, tokens: torch.Tensor) -> tuple[torch.Tensor, torch.cuda.Event | None]:
        self._turn ^= 1
        n = tokens.shape[0]
        if self._bufs[self._turn].shape[0] < n:
            self._bufs[self._turn] = self._new(n)
        host = self._bufs[self._turn]
        host[:n].copy_(tokens, non_blocking=self._pinned)
        if not self._pinned:
            return host, None
        event = torch.cuda.Event()
        event.record()  # type: ignore[no-untyped-call]
        return host, event


class DeviceSampler:
    def __init__(self, device: torch.device, seed: int) -> None:
        self.device = device
        self._rng = np.random.default_rng(seed)
        self.counts = TokenCounts(device)

    def _dev(self, a: np.ndarray) -> torch.Tensor:
        return torch.from_numpy(np.ascontiguousarray(a)).to(self.device, non_blocking=True)

    def pick(
        self,
        plan: BatchPlan,
        rows: np.ndarray,
        offsets: np.ndarray | None,
        logits: torch.Tensor,
        argmax: torch.Tensor | None,
    ) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None]:
        """Tokens (int32 [N], device) for `logits` [N, V], plus device logprobs if asked.
        `argmax` (int32 [N]) is the greedy choice when the step computed it already."""
        s = plan.sampling
        constrained = s.constrained or s.penalized
        logits = constrain_logits(logits, s, rows)  # mask + bias first: sampling and logprobs
        if s.penalized:
            logits = self._penalize(logits, s, rows)
        temp = s.temperature[rows].astype(np.float32)
        greedy = (s.top_k[rows] == 1) | (temp < GREEDY_TEMPERATURE)
        temp = np.where(greedy, np.float32(0), temp)
        if not np.any(temp > 0):
            if argmax is None or constrained:
                argmax = argmax_rows(logits)
            tokens = argmax
        else:
            top_k, top_p, min_p = s.top_k[rows], s.top_p[rows], s.min_p[rows]
            needs_filter = bool(np.any((temp > 0) & ((top_k > 0) | (top_p < 1) | (min_p > 0))))
            position = s.output_index[rows].astype(np.int64)
            if offsets is not None:
                position = position + offsets
            seeds = philox_seeds(s.seed[rows], position, self._rng)
            tokens = sample_tokens(
                logits.contiguous(),
                self._dev(temp),
                self._dev(top_k.astype(np.int32)),
                self._dev(top_p.astype(np.float32)),
                self._dev(min_p.astype(np.float32)),
                self._dev(seeds.astype(np.int64)),
                needs_filter=needs_filter,
            ).to(torch.int32)
        if s.penalized:
            self.counts.record(s, rows, tokens)
        return tokens, self._logprobs(s.logprobs[rows], logits, tokens)

    def _penalize(self, logits: torch.Tensor, s: SamplingArrays, rows: np.ndarray) -> torch.Tensor:
        slots = self.counts.prepare(s, rows, logits.shape[1])
        return apply_penalties(
            logits.contiguous(),
            slots,
            self.counts.counts,
            self.counts.prompt,
            self._dev(s.presence_penalty[rows].astype(np.float32)),
            self._dev(s.frequency_penalty[rows].astype(np.float32)),
            self._dev(s.repetition_penalty[rows].astype(np.float32)),
        )

    @staticmethod
    def _logprobs(
        asked: np.ndarray, logits: torch.Tensor, tokens: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None:
        if asked.shape[0] == 0 or asked.max(initial=-1) < 0:
            return None
        logp = torch.log_softmax(logits.float(), dim=-1)
        chosen = logp.gather(1, tokens.view(-1, 1).long()).squeeze(1)
        k = int(asked.max())
        top_lp, top_ids = logp.topk(k, dim=-1) if k > 0 else (logp[:, :0], logp[:, :0].long())
        return chosen, top_ids, top_lp


def plain_output(
    plan: BatchPlan, rows: np.ndarray, tokens: np.ndarray, lps: tuple | None
) -> ForwardOutput:
    """One token per sampled row (`rows`, in order)."""
    counts = np.zeros(plan.num_sequences, dtype=np.uint32)
    counts[rows] = 1
    indptr = np.concatenate(([0], np.cumsum(counts))).astype(np.uint32)
    return _output(tokens.astype(np.uint32), indptr, lps)


def speculative_output(
    plan: BatchPlan,
    rows: np.ndarray,
    offsets: np.ndarray,
    tokens: np.ndarray,
    lps: tuple | None,
    accept_first: int | None = None,
) -> ForwardOutput:
    """Tokens x_j of every query token j of each row (`rows` / `offsets` per entry, rows in
    order): the row keeps x_0..x_a, a = its leading drafts that equal their x_j. With
    `accept_first` = K (bench only: `resin bench speculative --accepted-drafts K`) a row keeps
    its first min(k, K) drafts' x_j whatever they are, then one more."""
    b = plan.num_sequences
    k = np.zeros(b, dtype=np.int64)
    if plan.draft_indptr.size:
        k = np.diff(plan.draft_indptr).astype(np.int64)
    has = offsets < k[rows]
    draft = np.full(rows.shape[0], -1, dtype=np.int64)
    if has.any():
        flat = plan.draft_indptr[:-1].astype(np.int64)[rows] + offsets
        draft[has] = plan.draft_ids[flat[has]]
    miss = (tokens.astype(np.int64) != draft).astype(np.int64)
    if accept_first is not None:
        miss = (offsets >= np.minimum(k[rows], accept_first)).astype(np.int64)
    before = np.cumsum(miss) - miss  # mismatches before each entry, over the whole step
    first = np.arange(rows.shape[0]) - offsets  # each row's first entry
    keep = before == before[first]
    counts = np.bincount(rows[keep], minlength=b)
    indptr = np.concatenate(([0], np.cumsum(counts))).astype(np.uint32)
    if lps is not None:
        lps = tuple(a[keep] for a in lps)
    return _output(tokens[keep].astype(np.uint32), indptr, lps)


def _output(token_ids: np.ndarray, indptr: np.ndarray, lps: tuple | None) -> ForwardOutput:
    if lps is None:
        return ForwardOutput(token_ids=token_ids, token_indptr=indptr)
    chosen, top_ids, top_lp = lps
    return ForwardOutput(
        token_ids=token_ids,
        token_indptr=indptr,
        logprobs=chosen,
        top_ids=top_ids,
        top_logprobs=top_lp,
    )
