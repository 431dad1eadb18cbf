"""Presence, frequency and repetition penalties over per-slot token counts on the device.

`TokenCounts` keeps the plan's count slots (`SamplingArrays`, "Penalties"): `counts[s, v]`,
how many times slot s generated token v, and `prompt[s, v]`, whether v is in its prompt. It
changes only by the plan's resets (ids copied host -> device) and by the runner's own sampled
tokens, so nothing waits for the host: overlapped plans see exactly the tokens before them.
The tables grow to the highest slot a plan names (the engine's slots are dense from 0).

`penalize` is the reference rule, in plain torch (both runner families keep counts here;
`resin_models_cuda` applies the same rule with a kernel):
- repetition r (vLLM / Hugging Face), for tokens in the prompt or generated: a positive logit
  is divided by r, a negative one multiplied;
- then frequency f and presence p (OpenAI), over generated tokens: `x -= f * count + p * seen`.
"""

from __future__ import annotations

import numpy as np
import torch

from resin.plan import SamplingArrays


class TokenCounts:
    """Per-slot generated-token counts and prompt-token sets (see module docstring)."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.counts = torch.zeros((0, 0), dtype=torch.int32, device=device)
        self.prompt = torch.zeros((0, 0), dtype=torch.bool, device=device)

    def prepare(self, params: SamplingArrays, rows: np.ndarray, vocab: int) -> torch.Tensor:
        """Apply the plan's resets; return the count slot of each logits row (int64 [N] on
        the device, -1 for rows without penalties). `rows` are the plan rows sampled."""
        slots = params.count_slot[rows].astype(np.int64)
        if np.unique(slots[slots >= 0]).size != int((slots >= 0).sum()):
            raise ValueError("a penalized row samples once per step (no drafts)")
        self._grow(int(params.count_slot.max(initial=-1)) + 1, vocab)
        if params.count_reset_indptr.size:
            self._reset(params)
        return torch.from_numpy(slots).to(self.device, non_blocking=True)

    def record(self, params: SamplingArrays, rows: np.ndarray, tokens: torch.Tensor) -> None:
        """Count each penalized row's sampled token (`tokens` [N] on the device)."""
        keep = np.flatnonzero(params.count_slot[rows] >= 0)
        if not keep.size:
            return
        slots = torch.from_numpy(params.count_slot[rows][keep].astype(np.int64)).to(self.device)
        picked = tokens[torch.from_numpy(keep).to(self.device)].long()
        ones = torch.ones(keep.size, dtype=torch.int32, device=self.device)
        self.counts.index_put_((slots, picked), ones, accumulate=True)

    def _grow(self, slots: int, vocab: int) -> None:
        have, width = self.counts.shape
        if slots <= have and vocab <= width:
            return
        rows, cols = max(slots, 2 * have), max(vocab, width)
        counts = torch.zeros((rows, cols), dtype=torch.int32, device=self.device)
        prompt = torch.zeros((rows, cols), dtype=torch.bool, device=self.device)
        counts[:have, :width] = self.counts
        prompt[:have, :width] = self.prompt
        self.counts, self.prompt = counts, prompt

    def _reset(self, params: SamplingArrays) -> None:
        indptr = params.count_reset_indptr
        lens = np.diff(indptr)
        rows = np.flatnonzero((lens > 0) & (params.count_slot >= 0))
        if not rows.size:
            return
        slot_of = params.count_slot[rows].astype(np.int64)
        dev = lambda a: torch.from_numpy(np.ascontiguousarray(a)).to(self.device)  # noqa: E731
        self.counts[dev(slot_of)] = 0
        self.prompt[dev(slot_of)] = False
        starts, n_prompt = indptr[rows], params.count_reset_prompt[rows]
        ids = [params.count_reset_ids[s : s + n] for s, n in zip(starts, lens[rows], strict=True)]
        is_prompt = np.concatenate(
            [np.arange(n) < p for n, p in zip(lens[rows], n_prompt, strict=True)]
        )
        flat = np.concatenate(ids).astype(np.int64)
        owner = np.repeat(slot_of, lens[rows])
        self.prompt[dev(owner[is_prompt]), dev(flat[is_prompt])] = True
        gen = ~is_prompt
        if gen.any():
            ones = torch.ones(int(gen.sum()), dtype=torch.int32, device=self.device)
            self.counts.index_put_((dev(owner[gen]), dev(flat[gen])), ones, accumulate=True)


def penalize(
    logits: torch.Tensor, params: SamplingArrays, rows: np.ndarray, counts: TokenCounts
) -> torch.Tensor:
    """`logits` [N, V] with the rows' penalties applied (a new tensor; the reference rule)."""
    slots = counts.prepare(params, rows, logits.shape[1])
    keep = np.flatnonzero(params.count_slot[rows] >= 0)
    if not keep.size:
        return logits
    index = torch.from_numpy(keep).to(logits.device)
    vocab = logits.shape[1]
    count = counts.counts[slots[index], :vocab]
    seen = counts.prompt[slots[index], :vocab] | (count > 0)
    col = lambda a: torch.from_numpy(a[rows][keep]).to(logits.device)[:, None]  # noqa: E731
    rep, freq, pres = (
        col(params.repetition_penalty),
        col(params.frequency_penalty),
        col(params.presence_penalty),
    )
    x = logits[index].float()
    x = torch.where(seen, torch.where(x > 0, x / rep, x * rep), x)
    x = x - freq * count - pres * (count > 0)
    out = logits.float().clone()
    out[index] = x
    return out
