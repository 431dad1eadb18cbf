"""Per-step tensors derived once from a `BatchPlan` and shared by every layer of a group.

The step's flat query tokens are laid out as a padded [B, Q] grid (Q = longest row of the
step): `query_index[b, j]` is the flat index of row b's j-th query token (0 where padded), and
`token_rows/token_cols` map each flat token back into the grid. All index math is numpy on the
host, done once per step; layers only gather and scatter.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from resin.plan import BatchPlan, CacheGroupPlan


@dataclass(frozen=True, slots=True)
class Grid:
    """The padded [B, Q] layout of a step's query tokens (host copies kept for planning)."""

    query_index: torch.Tensor  # [B, Q] long
    query_valid: torch.Tensor  # [B, Q] bool
    token_rows: torch.Tensor  # [T] long
    token_cols: torch.Tensor  # [T] long
    np_index: np.ndarray
    np_valid: np.ndarray
    np_positions: np.ndarray  # [B, Q] position of each grid slot (-1 where padded)


@dataclass(frozen=True, slots=True)
class AttentionBatch:
    """History / Window group: where cached keys live and which keys each query may see.

    `cached_pages/offsets` [B, C]: arena page and in-page offset of every cached key a row
    needs (padding points at page 0, masked out); `mask` [B, Q, C+Q] covers cached keys then
    the step's new keys in grid order.
    """

    query_index: torch.Tensor
    token_rows: torch.Tensor
    token_cols: torch.Tensor
    cached_pages: torch.Tensor
    cached_offsets: torch.Tensor
    append_pages: torch.Tensor
    append_offsets: torch.Tensor
    mask: torch.Tensor


@dataclass(frozen=True, slots=True)
class StateBatch:
    """State group (conv state): which checkpoint each row reads and where states go."""

    query_index: torch.Tensor
    query_valid: torch.Tensor
    token_rows: torch.Tensor
    token_cols: torch.Tensor
    state_in: torch.Tensor  # [B] long, -1 = zeros
    has_state: torch.Tensor  # [B] float 0/1
    state_rows: torch.Tensor  # rows with a state_out page
    state_out: torch.Tensor  # their pages
    final_window: torch.Tensor  # [B, K-1] columns of the row's last K-1 inputs in `full`
    checkpoint_rows: torch.Tensor  # [X]
    checkpoint_window: torch.Tensor  # [X, K-1]
    checkpoint_pages: torch.Tensor  # [X]
    checkpoint_local: np.ndarray  # [X] index of the checkpoint's token inside its row


@dataclass(frozen=True, slots=True)
class EntryBatch:
    """Compressed group: where each row's entries live and where this step's new ones go.

    `pages/offsets` [B, W]: arena page and in-page offset of entry w of row b for
    w < counts[b] (the row's complete entries after the step; padding points at page 0);
    `new_pages/new_offsets` [N]: the slots of the entries the step completes, row by row in
    entry order (`new_indptr`)."""

    pages: torch.Tensor
    offsets: torch.Tensor
    counts: list[int]
    new_pages: torch.Tensor
    new_offsets: torch.Tensor
    new_indptr: list[int]


def make_grid(plan: BatchPlan, device: torch.device) -> Grid:
    lens = plan.query_lens.astype(np.int64)
    width = int(lens.max())
    cols = np.arange(width)[None, :]
    valid = cols < lens[:, None]
    index = np.where(valid, plan.query_indptr[:-1, None] + cols, 0).astype(np.int64)
    rows_of_tokens = np.repeat(np.arange(len(lens)), lens)
    cols_of_tokens = np.arange(plan.num_tokens) - np.repeat(plan.query_indptr[:-1], lens)
    positions = np.where(valid, plan.positions[index], -1)
    return Grid(
        query_index=_t(index, device),
        query_valid=_t(valid, device),
        token_rows=_t(rows_of_tokens.astype(np.int64), device),
        token_cols=_t(cols_of_tokens.astype(np.int64), device),
        np_index=index,
        np_valid=valid,
        np_positions=positions,
    )


def attention_batch(
    plan: BatchPlan,
    group: CacheGroupPlan,
    grid: Grid,
    page_size: int,
    window: int | None,
    device: torch.device,
    first_key: int = 0,
) -> AttentionBatch:
    """Resolve one History/Window group's page rows into gather indices and a mask.

    A row's cached keys are positions lo..cached_len-1, where lo is the first position its page
    row still lists and, for a Window group, also the oldest position its first query can see
    (query at p sees (p - window, p], exactly Hugging Face's sliding-window mask). Keys before
    `first_key` are never seen (DeepSeek's MTP layer has no entry at position 0).
    """
    cached = plan.cached_lens.astype(np.int64)
    lo = group.page_start.astype(np.int64) * page_size
    if window is not None:
        first_query = grid.np_positions[:, 0].astype(np.int64)
        lo = np.maximum(lo, first_query - window + 1)
    lo = np.minimum(np.maximum(lo, first_key), cached)
    counts = cached - lo
    width = int(counts.max(initial=0))
    j = np.arange(width)[None, :]
    key_valid = j < counts[:, None]
    key_pos = np.where(key_valid, lo[:, None] + j, 0)
    entry = group.page_indptr[:-1, None] + key_pos // page_size - group.page_start[:, None]
    entry = np.where(key_valid, entry, 0)
    pages = np.where(key_valid, group.page_ids[entry] if group.page_ids.size else 0, 0)
    offsets = np.where(key_valid, key_pos % page_size, 0)

    all_pos = np.concatenate((np.where(key_valid, key_pos, -1), grid.np_positions), axis=1)
    all_valid = np.concatenate((key_valid, grid.np_valid), axis=1)
    q_pos = grid.np_positions[:, :, None]
    mask = all_valid[:, None, :] & grid.np_valid[:, :, None] & (all_pos[:, None, :] <= q_pos)
    if first_key:
        mask &= all_pos[:, None, :] >= first_key
    if window is not None:
        mask &= all_pos[:, None, :] > q_pos - window
    slots = group.append_slots.astype(np.int64)
    return AttentionBatch(
        query_index=grid.query_index,
        token_rows=grid.token_rows,
        token_cols=grid.token_cols,
        cached_pages=_t(pages.astype(np.int64), device),
        cached_offsets=_t(offsets.astype(np.int64), device),
        append_pages=_t(slots // page_size, device),
        append_offsets=_t(slots % page_size, device),
        mask=_t(mask, device),
    )


def state_batch(
    plan: BatchPlan, group: CacheGroupPlan, grid: Grid, width: int, device: torch.device
) -> StateBatch:
    """Resolve a State group: `width` = K-1 inputs kept per conv layer.

    In the concatenation [state (width) | row inputs (Q)], the state after the row's query
    token j is columns j+1 .. j+width; after its last token, columns len .. len+width-1.
    """
    lens = plan.query_lens.astype(np.int64)
    span = np.arange(width)[None, :]
    final = lens[:, None] + span
    flat = group.checkpoint_token.astype(np.int64)
    rows = np.searchsorted(plan.query_indptr, flat, side="right") - 1
    local = flat - plan.query_indptr[rows]
    ckpt_window = local[:, None] + 1 + span
    state_in = group.state_in.astype(np.int64)
    out_rows = np.nonzero(group.state_out >= 0)[0]
    return StateBatch(
        query_index=grid.query_index,
        query_valid=grid.query_valid,
        token_rows=grid.token_rows,
        token_cols=grid.token_cols,
        state_in=_t(state_in, device),
        has_state=_t((state_in >= 0).astype(np.float32), device),
        state_rows=_t(out_rows.astype(np.int64), device),
        state_out=_t(group.state_out[out_rows].astype(np.int64), device),
        final_window=_t(final.astype(np.int64), device),
        checkpoint_rows=_t(rows.astype(np.int64), device),
        checkpoint_window=_t(ckpt_window.reshape(-1, width).astype(np.int64), device),
        checkpoint_pages=_t(group.checkpoint_page.astype(np.int64), device),
        checkpoint_local=local,
    )


def entry_batch(
    plan: BatchPlan, group: CacheGroupPlan, ratio: int, per_page: int, device: torch.device
) -> EntryBatch:
    """Resolve a Compressed(ratio) group with `per_page` entries per page."""
    counts = plan.total_lens.astype(np.int64) // ratio
    width = int(counts.max(initial=0))
    w = np.arange(width)[None, :]
    valid = w < counts[:, None]
    entry = np.where(valid, group.page_indptr[:-1, None] + w // per_page, 0)
    pages = np.where(valid, group.page_ids[entry] if group.page_ids.size else 0, 0)
    offsets = np.where(valid, w % per_page, 0)
    slots = group.entry_slots.astype(np.int64)
    return EntryBatch(
        pages=_t(pages.astype(np.int64), device),
        offsets=_t(offsets.astype(np.int64), device),
        counts=counts.tolist(),
        new_pages=_t(slots // per_page, device),
        new_offsets=_t(slots % per_page, device),
        new_indptr=group.entry_indptr.astype(np.int64).tolist(),
    )


def _t(array: np.ndarray, device: torch.device) -> torch.Tensor:
    return torch.from_numpy(np.ascontiguousarray(array)).to(device)


@dataclass(frozen=True, slots=True)
class KvSpec:
    """A History (window None) or Window group: `num_layers` layers of K and V per page."""

    num_layers: int
    num_kv_heads: int
    head_dim: int
    window: int | None = None


@dataclass(frozen=True, slots=True)
class ConvSpec:
    """A State group: one checkpoint of `num_layers` conv states [channels, width] per page."""

    num_layers: int
    channels: int
    width: int


@dataclass(frozen=True, slots=True)
class LatentSpec:
    """A History group of MLA layers: one latent vector of `width` values (DeepSeek's
    kv_lora_rank + rope dim) per token per layer, instead of per-head K and V; with a
    `window`, a Window group of such vectors (DeepSeek-V4's shared K=V head)."""

    num_layers: int
    width: int
    window: int | None = None


@dataclass(frozen=True, slots=True)
class EntrySpec:
    """A Compressed(ratio) group: `num_layers` layers of one `width`-value entry per `ratio`
    tokens (DeepSeek-V4's compressed K=V entries, with the indexer's keys beside them)."""

    num_layers: int
    width: int
    ratio: int


@dataclass(frozen=True, slots=True)
class BufferSpec:
    """A State group of `num_layers` layers of up to `tokens` buffered per-token vectors of
    `width` values (DeepSeek-V4's compressor inputs not yet pooled into an entry); `rewind`
    of the tokens are room to serve a length that many tokens shorter (`State.rewind`)."""

    num_layers: int
    tokens: int
    width: int
    rewind: int = 0


@dataclass(frozen=True, slots=True)
class LinearStateSpec:
    """A State group of linear-attention layers (Gated DeltaNet): per layer, one checkpoint is
    the float32 recurrent matrices [heads, key_dim, value_dim] followed by the conv's last
    `width` inputs [channels, width] in the model dtype; a page holds every layer's."""

    num_layers: int
    channels: int
    width: int
    heads: int
    key_dim: int
    value_dim: int

    def recurrent_bytes(self) -> int:
        return 4 * self.heads * self.key_dim * self.value_dim

    def layer_bytes(self, itemsize: int) -> int:
        """Bytes of one layer's checkpoint, rounded to 16 so every layer's float32 part
        starts aligned."""
        raw = self.recurrent_bytes() + self.channels * self.width * itemsize
        return -(-raw // 16) * 16

    def split(self, cache: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """One layer's uint8 view [pages, layer_bytes] -> (conv [pages, channels, width] in
        `dtype`, recurrent [pages, heads, key_dim, value_dim] float32), both views of it."""
        rec_end = self.recurrent_bytes()
        conv_end = rec_end + self.channels * self.width * torch.empty(0, dtype=dtype).itemsize
        recurrent = cache[:, :rec_end].view(torch.float32)
        conv = cache[:, rec_end:conv_end].view(dtype)
        return (
            conv.unflatten(-1, (self.channels, self.width)),
            recurrent.unflatten(-1, (self.heads, self.key_dim, self.value_dim)),
        )


CacheSpec = KvSpec | ConvSpec | LatentSpec | EntrySpec | BufferSpec | LinearStateSpec


@dataclass(frozen=True, slots=True)
class LayerSlot:
    """Where a layer keeps its cache: group index and the layer's index inside that group."""

    group: int
    index: int


@dataclass(frozen=True, slots=True)
class MediaBatch:
    """Encoder features of a step: `features[i]` replaces the embedding of flat query token
    `token_index[i]`; `rope_positions` [3, T] are M-RoPE positions (Qwen-VL) or None."""

    token_index: torch.Tensor
    features: torch.Tensor
    rope_positions: torch.Tensor | None = None


@dataclass(frozen=True, slots=True)
class StepContext:
    """What layers see of one step: positions, per-group batches and per-group cache views
    (KV: [pages, layers, 2, page_size, Hkv, D]; latent: [pages, layers, page_size, width];
    conv: [pages, layers, channels, width]) and, for multimodal models, the step's encoder
    features."""

    positions: torch.Tensor
    batches: tuple[AttentionBatch | StateBatch | EntryBatch, ...]
    caches: tuple[torch.Tensor, ...]
    media: MediaBatch | None = None

    def attention(self, slot: LayerSlot) -> tuple[torch.Tensor, AttentionBatch]:
        batch = self.batches[slot.group]
        assert isinstance(batch, AttentionBatch)
        return self.caches[slot.group][:, slot.index], batch

    def entries(self, slot: LayerSlot) -> tuple[torch.Tensor, EntryBatch]:
        batch = self.batches[slot.group]
        assert isinstance(batch, EntryBatch)
        return self.caches[slot.group][:, slot.index], batch

    def state(self, slot: LayerSlot) -> tuple[torch.Tensor, StateBatch]:
        batch = self.batches[slot.group]
        assert isinstance(batch, StateBatch)
        return self.caches[slot.group][:, slot.index], batch
