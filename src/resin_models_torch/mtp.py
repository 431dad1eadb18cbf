"""DeepSeek multi-token prediction (MTP) as a draft source for speculative decoding.

`MtpRunner` is a `TorchRunner` for a DeepSeek (V3 or V4) checkpoint with MTP layers. The model
says what its MTP layer pairs a token with (`draft_source`: V3's final hidden state, V4's
final mHC streams) and which cache groups drafting needs (`drafting_specs`: the MTP layer as
one more layer of group 0, V3's latents or V4's window; V4's compressor State able to drop
rejected drafts). Each step, after the
main model, it runs the first MTP layer on the step's tokens — token i paired with the main
model's final hidden state at i-1 — at the same positions and append slots, so the MTP cache
layer (one more layer of the latent group, which `MtpRunner` declares and a plain
`TorchRunner` does not) fills alongside the main ones. An entry at position
i depends only on tokens 0..i, so prefix-cached pages carry valid MTP entries too; position 0
has no pair and is never attended. The hidden state at i-1 comes from the same step or, for a
row's first token, from the row's previous step (zeros after a prefix hit: a draft may then be
worse, never wrong).

After sampling, every row that produced a token gets `num_drafts` greedy drafts: the MTP layer
on (the new token, the hidden state of the last accepted position), attended over the row's MTP
cache without being stored, gives draft 1; draft j+1 chains the same layer on (draft j, the MTP
hidden state that predicted it) one position further, the chain recomputed as a window of
non-stored queries. They travel in the step's `ForwardOutput.draft_ids` (the engine keeps them
with the request; `MtpProposer` offers them back to speculative decoding); the runner's own
record, `drafts[seq_id] = (num_tokens, tokens)` (the drafts that should follow a sequence of
`num_tokens` tokens), is for inspection. Verification (the target runner's) keeps outputs
exact whatever the drafts are.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import numpy as np
import torch

from resin.plan import BatchPlan, CacheGroupPlan, ForwardOutput
from resin_models_torch.batch import (
    AttentionBatch,
    LatentSpec,
    StepContext,
    attention_batch,
    make_grid,
)
from resin_models_torch.deepseek import DeepseekForCausalLM
from resin_models_torch.deepseek_v4 import DeepseekV4ForCausalLM
from resin_models_torch.runner import RecordedStep, TorchRunner

MAX_REMEMBERED = 4096  # rows whose last hidden state is kept between steps


class MtpRunner(TorchRunner):
    """A `TorchRunner` that also proposes MTP drafts (see the module docstring)."""

    def __init__(
        self,
        model: DeepseekForCausalLM | DeepseekV4ForCausalLM,
        *,
        num_drafts: int = 1,
        **kwargs: Any,
    ) -> None:
        if not isinstance(model, DeepseekForCausalLM | DeepseekV4ForCausalLM) or not model.mtp:
            raise ValueError("MtpRunner needs a DeepSeek model whose checkpoint has MTP layers")
        if num_drafts < 1:
            raise ValueError("num_drafts must be >= 1")
        # The MTP layers cache as more layers of group 0 (set, not added: several runners may
        # wrap one model).
        model.cache_specs = model.drafting_specs(num_drafts)
        super().__init__(model, **kwargs)
        self.num_drafts = num_drafts
        self.deepseek = model
        spec = model.cache_specs[0]
        assert isinstance(spec, LatentSpec)
        self.window = spec.window
        self.drafts: dict[int, tuple[int, list[int]]] = {}
        self.mtp_recorded: list[RecordedStep] = []  # MTP logits of every token (record_logits)
        self._previous: dict[int, tuple[int, torch.Tensor]] = {}  # sid -> (position, hidden)
        self._ids = torch.zeros(0, dtype=torch.long)

    def _input_ids(self, plan: BatchPlan) -> torch.Tensor:
        self._ids = super()._input_ids(plan)
        return self._ids

    def _outputs(self, plan: BatchPlan, hidden: torch.Tensor) -> ForwardOutput:
        output = super()._outputs(plan, hidden)
        return self._advance(plan, hidden, output)

    def _advance(
        self, plan: BatchPlan, hidden: torch.Tensor, output: ForwardOutput
    ) -> ForwardOutput:
        hidden = self.deepseek.draft_source(hidden)
        group = plan.cache_groups[0]
        starts = plan.query_indptr[:-1].astype(np.int64)
        sids = plan.sequence_ids.tolist()
        previous = torch.cat((torch.zeros_like(hidden[:1]), hidden[:-1]))
        for row, start in enumerate(starts.tolist()):
            kept = self._previous.get(sids[row])
            first = int(plan.positions[start])
            ok = kept is not None and kept[0] == first - 1
            previous[start] = kept[1] if ok and kept is not None else 0.0
        grid = make_grid(plan, self.device)
        batch = attention_batch(
            plan, group, grid, self.page_size, self.window, self.device, first_key=1
        )
        ids = self._ids  # the step's tokens, pipelined rows' resolved from the last samples
        ctx = self._ctx(plan.positions, batch)
        mtp_hidden, _ = self.deepseek.mtp_step(0, ids, previous, ctx)
        if self.record_logits:
            rows = np.repeat(np.arange(plan.num_sequences), plan.query_lens)
            logits = self.model.logits(mtp_hidden).float().cpu()
            step = RecordedStep(plan.step_id, plan.sequence_ids[rows], plan.positions, logits)
            self.mtp_recorded.append(step)
        return self._draft(plan, group, hidden, output)

    def _draft(
        self, plan: BatchPlan, group: CacheGroupPlan, hidden: torch.Tensor, output: ForwardOutput
    ) -> ForwardOutput:
        """`output` with each producing row's drafts (`ForwardOutput.draft_ids`)."""
        produced = np.diff(output.token_indptr.astype(np.int64))
        drafts = np.diff(plan.draft_indptr.astype(np.int64)) if plan.draft_ids.size else 0
        valid = plan.query_lens.astype(np.int64) - drafts + np.maximum(produced - 1, 0)
        last = plan.query_indptr[:-1].astype(np.int64) + valid - 1  # last accepted token
        for row, sid in enumerate(plan.sequence_ids.tolist()):
            self._previous[sid] = (int(plan.positions[last[row]]), hidden[last[row]].clone())
        for remembered in (self._previous, self.drafts):  # forget rows seen longest ago
            for sid in list(remembered)[: max(len(remembered) - MAX_REMEMBERED, 0)]:
                del remembered[sid]
        rows = np.flatnonzero(produced > 0)
        indptr = np.zeros(plan.num_sequences + 1, dtype=np.int32)
        np.cumsum(np.where(produced > 0, self.num_drafts, 0), out=indptr[1:])
        if not rows.size:
            return replace(output, draft_ids=np.zeros(0, dtype=np.int32), draft_indptr=indptr)
        new_tokens = output.token_ids[output.token_indptr[rows + 1].astype(np.int64) - 1]
        first = plan.positions[last[rows]].astype(np.int64) + 1  # the new token's position
        index = torch.from_numpy(last[rows]).to(self.device)
        tokens = [torch.from_numpy(new_tokens.astype(np.int64)).to(self.device)]
        previous = [hidden[index]]
        for depth in range(self.num_drafts):
            # The chain so far (the new token, then drafts 1..depth) as one non-stored window
            # of queries over the cached MTP entries: the last query gives the next draft.
            width = depth + 1
            positions = first[:, None] + np.arange(width)[None, :]
            batch = draft_batch(group, rows, first, width, self.page_size, self.device, self.window)
            ids = torch.stack(tokens, dim=1).flatten()
            ctx = self._ctx(positions.flatten(), batch)
            out, chain = self.deepseek.mtp_step(
                0, ids, torch.stack(previous, dim=1).flatten(0, 1), ctx
            )
            newest = out.view(len(rows), width, -1)[:, -1]
            tokens.append(self.model.logits(newest).argmax(dim=-1))
            previous.append(chain.view(len(rows), width, *chain.shape[1:])[:, -1])
        drafted = torch.stack(tokens[1:], dim=1).tolist()
        for row, position, chain in zip(rows.tolist(), first.tolist(), drafted, strict=True):
            self.drafts[int(plan.sequence_ids[row])] = (position + 1, [int(t) for t in chain])
        flat = np.asarray(drafted, dtype=np.int32).reshape(-1)
        return replace(output, draft_ids=flat, draft_indptr=indptr)

    def _ctx(self, positions: np.ndarray, batch: AttentionBatch) -> StepContext:
        tensor = torch.from_numpy(positions.astype(np.int64)).to(self.device)
        return StepContext(tensor, (batch,), self._views)


def draft_batch(
    group: CacheGroupPlan,
    rows: np.ndarray,
    first: np.ndarray,
    width: int,
    page_size: int,
    device: Any,
    window: int | None = None,
) -> AttentionBatch:
    """`width` queries per row at positions first[i] .. first[i] + width - 1 (never stored),
    seeing the row's cached keys at positions 1 .. first[i]-1 through its page row, then each
    other causally; with a `window`, query p sees positions (p - window, p] only. Queries are
    laid out row-major: query j of row i is flat token i*width+j."""
    lo = np.maximum(group.page_start[rows].astype(np.int64) * page_size, 1)
    counts = np.maximum(first - lo, 0)
    j = np.arange(int(counts.max(initial=0)))[None, :]
    valid = j < counts[:, None]
    key_pos = lo[:, None] + j
    entry = group.page_indptr[rows, None] + key_pos // page_size - group.page_start[rows, None]
    pages = np.where(valid, group.page_ids[np.where(valid, entry, 0)], 0)
    b = len(rows)
    causal = np.tril(np.ones((width, width), dtype=bool))
    seen = np.repeat(valid[:, None, :], width, axis=1)
    if window is not None:  # query j of row i is at first[i] + j
        query_pos = first[:, None, None] + np.arange(width)[None, :, None]
        seen &= key_pos[:, None, :] > query_pos - window
        causal &= np.arange(width)[None, :] > np.arange(width)[:, None] - window
    mask = np.concatenate((seen, np.broadcast_to(causal, (b, width, width))), axis=2)

    def t(array: np.ndarray) -> torch.Tensor:
        return torch.from_numpy(np.ascontiguousarray(array)).to(device)

    empty = t(np.zeros(0, dtype=np.int64))
    grid = np.arange(b * width, dtype=np.int64).reshape(b, width)
    return AttentionBatch(
        query_index=t(grid),
        token_rows=t(np.repeat(np.arange(b, dtype=np.int64), width)),
        token_cols=t(np.tile(np.arange(width, dtype=np.int64), b)),
        cached_pages=t(pages.astype(np.int64)),
        cached_offsets=t(np.where(valid, key_pos % page_size, 0).astype(np.int64)),
        append_pages=empty,
        append_offsets=empty,
        mask=t(mask),
    )
