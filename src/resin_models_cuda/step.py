"""The device tensors of one forward step, as the layers read them.

Every cache group (History for full attention, Window for sliding layers) has its own page
table and append slots; a layer reads the group it belongs to (`LayerSlot`). Decode steps carry
`DecodeInfo` (`query` tokens per row: 1, or 1 + k for rows verifying k drafts; fixed shapes:
CUDA-graph safe); other steps carry
`PrefillInfo` (varlen query chunks over cached prefixes; with images, each query token's
bidirectional span end) and, when the step computes image tokens, their encoder features
(`MediaTensors`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True, slots=True)
class LayerSlot:
    """Layer `index` of cache group `group` (the arena holds `index` among that group's layers)."""

    group: int
    index: int


@dataclass(frozen=True, slots=True)
class GroupTensors:
    """One cache group's int32 tensors: append slot per token, CSR page rows, first page index."""

    slots: torch.Tensor
    page_indptr: torch.Tensor
    page_ids: torch.Tensor
    page_start: torch.Tensor


@dataclass(frozen=True, slots=True)
class DecodeInfo:
    seq_lens: torch.Tensor  # int32 [B]: cached tokens including the queries (0: padding row)
    splits: int
    query: int = 1  # query slots per row (token t belongs to row t // query)
    q_lens: torch.Tensor | None = None  # int32 [B]: real query tokens per row (query > 1)


@dataclass(frozen=True, slots=True)
class PrefillInfo:
    query_indptr: torch.Tensor
    cached_lens: torch.Tensor
    block_row: torch.Tensor
    block_off: torch.Tensor
    block_m: int
    span_end: torch.Tensor | None = None  # int32 [T]: see kernels/prefill_attention.py


@dataclass(frozen=True, slots=True)
class MediaTensors:
    """`features[i]` replaces the (scaled) embedding of flat query token `token_index[i]`."""

    token_index: torch.Tensor
    features: torch.Tensor


@dataclass(frozen=True, slots=True)
class StepTensors:
    input_ids: torch.Tensor  # int32 [T]
    positions: torch.Tensor  # int32 [T]
    groups: tuple[GroupTensors, ...]
    info: DecodeInfo | PrefillInfo
    media: MediaTensors | None = None
