"""Images in the reference runner: the step's encoder features (`media_cache.MediaFeatures`:
each image encoded once, by content hash) go to the layers, and the causal mask widens over
bidirectional spans."""

from __future__ import annotations

from dataclasses import replace
from typing import Protocol, runtime_checkable

import numpy as np
import torch

from resin.plan import BatchPlan
from resin_model.media_cache import MediaFeatures
from resin_models_torch.batch import (
    AttentionBatch,
    EntryBatch,
    MediaBatch,
    StateBatch,
    StepContext,
)


@runtime_checkable
class MropeModel(Protocol):
    def rope_positions(self, plan: BatchPlan) -> np.ndarray:
        """[3, T] multimodal rotary positions of the plan's query tokens."""
        ...


class MediaEncoderCache(MediaFeatures):
    def attach(self, plan: BatchPlan, ctx: StepContext) -> StepContext:
        media = self.gather(plan)
        if not plan.media:
            return ctx
        device = ctx.positions.device
        rope = None
        if isinstance(self.model, MropeModel):
            rope = torch.from_numpy(self.model.rope_positions(plan)).to(device)
        if media is None:
            empty = torch.zeros(0, dtype=torch.long, device=device)
            return replace(ctx, media=MediaBatch(empty, torch.zeros(0, device=device), rope))
        token_index = torch.from_numpy(media.token_index).to(device)
        batches = ctx.batches
        if media.spans:
            batches = tuple(_widen(b, media.spans) for b in ctx.batches)
        return replace(ctx, batches=batches, media=MediaBatch(token_index, media.features, rope))


def _widen(
    batch: AttentionBatch | StateBatch | EntryBatch, spans: tuple[tuple[int, int, int], ...]
) -> AttentionBatch | StateBatch | EntryBatch:
    """Let each span's query tokens see the span's later tokens of this step (k > q)."""
    if not isinstance(batch, AttentionBatch):
        return batch
    mask = batch.mask.clone()
    offset = mask.shape[2] - mask.shape[1]  # cached keys come first
    for row, lo, hi in spans:
        n = hi - lo
        upper = torch.ones(n, n, dtype=torch.bool, device=mask.device).triu()
        mask[row, lo:hi, offset + lo : offset + hi] |= upper
    return replace(batch, mask=mask)
