"""Encoder features of a plan's images, shared by both runner families: each `MediaItem` is
encoded once, by content hash, and a step gets the features of its placeholder tokens.

Encoder outputs are cached by content hash while a span is being consumed: a chunked prefill
that cuts an image in three encodes it once. An entry leaves when its span ends in a step (and
no other row of that step still needs it), and the cache never holds more than `max_entries`
(an aborted request cannot pin features forever; a later chunk would re-encode).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import numpy as np
import torch

from resin.plan import BatchPlan, MediaItem


@runtime_checkable
class MultimodalModel(Protocol):
    def encode_media(self, item: MediaItem) -> torch.Tensor:
        """[item.length, hidden] features (in the embedding dtype)."""
        ...


@dataclass(frozen=True, slots=True)
class StepMedia:
    """The media tokens of one step: `features[i]` replaces the embedding of flat query token
    `token_index[i]`; `spans` are the bidirectional spans this step computes, as (row, lo, hi)
    query offsets inside the row (tokens `lo .. hi - 1` of its chunk)."""

    token_index: np.ndarray
    features: torch.Tensor
    spans: tuple[tuple[int, int, int], ...]


class MediaFeatures:
    """Encoder outputs by content hash (`model` must be a `MultimodalModel` to accept media)."""

    def __init__(self, model: object, max_entries: int = 64) -> None:
        self.model = model if isinstance(model, MultimodalModel) else None
        self.max_entries = max_entries
        self.features: dict[str, torch.Tensor] = {}
        self.encoded = 0  # encoder calls so far (tests read it)

    def gather(self, plan: BatchPlan) -> StepMedia | None:
        """The features of the plan's media tokens (None when none of its query tokens is
        one); a plan with media on a model without an encoder is a `ValueError`."""
        if not plan.media:
            return None
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
        if not rows:
            return None
        return StepMedia(np.concatenate(index), torch.cat(rows), tuple(spans))

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
