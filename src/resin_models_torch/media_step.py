"""Images in the reference runner: encode each plan `MediaItem` once, hand the layers the
features of this step's placeholder tokens, and widen the causal mask over bidirectional spans.

Encoder outputs are cached by content hash while a span is being consumed: a chunked prefill
that cuts an image in three encodes it once. An entry leaves when its span ends in a step (and
no other row of that step still needs it), and the cache never holds more than `max_entries`
(an aborted request cannot pin features forever; a later chunk would re-encode).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Protocol, runtime_checkable

import numpy as np
import torch

from resin.plan import BatchPlan, MediaItem
from resin_models_torch.batch import AttentionBatch, MediaBatch, StateBatch, StepContext


@runtime_checkable
class MultimodalModel(Protocol):
    def encode_media(self, item: MediaItem) -> torch.Tensor:
        """[item.length, hidden] features (in the embedding dtype)."""
        ...


@runtime_checkable
class MropeModel(Protocol):
    def rope_positions(self, plan: BatchPlan) -> np.ndarray:
        """[3, T] multimodal rotary positions of the plan's query tokens."""
        ...


class MediaEncoderCache:
    def __init__(self, model: object, max_entries: int = 64) -> None:
        self.model = model if isinstance(model, MultimodalModel) else None
        self.max_entries = max_entries
        self.features: dict[str, torch.Tensor] = {}
        self.encoded = 0  # encoder calls so far (tests read it)

    def attach(self, plan: BatchPlan, ctx: StepContext) -> StepContext:
        if not plan.media:
            return ctx
        if self.model is None:
            raise ValueError("this model has no vision encoder; the plan carries media")
        index: list[np.ndarray] = []
        rows: list[torch.Tensor] = []
        spans: list[tuple[int, int, int]] = []
        done: set[str] = set()
        pending: set[str] = set()
        for item in plan.media:
            cached, total = int(plan.cached_lens[item.row]), int(plan.total_lens[item.row])
            lo, hi = max(item.position, cached), min(item.end, total)
            if hi <= lo:
                continue
            features = self._features(item)
            first = int(plan.query_indptr[item.row]) + lo - cached
            index.append(np.arange(first, first + hi - lo))
            rows.append(features[lo - item.position : hi - item.position])
            if item.bidirectional:
                spans.append((item.row, lo - cached, hi - cached))
            (done if item.end <= total else pending).add(item.content_hash)
        for key in done - pending:
            self.features.pop(key, None)
        device = ctx.positions.device
        rope = None
        if isinstance(self.model, MropeModel):
            rope = torch.from_numpy(self.model.rope_positions(plan)).to(device)
        if not rows:
            empty = torch.zeros(0, dtype=torch.long, device=device)
            return replace(ctx, media=MediaBatch(empty, torch.zeros(0, device=device), rope))
        token_index = torch.from_numpy(np.concatenate(index)).to(device)
        batches = tuple(_widen(b, spans) for b in ctx.batches) if spans else ctx.batches
        media = MediaBatch(token_index, torch.cat(rows), rope)
        return replace(ctx, batches=batches, media=media)

    def _features(self, item: MediaItem) -> torch.Tensor:
        features = self.features.get(item.content_hash)
        if features is None:
            assert self.model is not None
            features = self.model.encode_media(item)
            self.encoded += 1
            if len(self.features) >= self.max_entries:
                self.features.pop(next(iter(self.features)))
            self.features[item.content_hash] = features
        return features


def _widen(
    batch: AttentionBatch | StateBatch, spans: list[tuple[int, int, int]]
) -> AttentionBatch | StateBatch:
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
