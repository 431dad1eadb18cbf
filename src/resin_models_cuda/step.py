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

from dataclasses import dataclass, field

import torch


@dataclass(frozen=True, slots=True)
class LayerSlot:
    """Layer `index` of cache group `group` (the arena holds `index` among that group's layers)."""

    group: int
    index: int


@dataclass(frozen=True, slots=True)
class GroupTensors:
    """One cache group's int32 tensors: append slot per token, CSR page rows, first page index;
    a Compressed group's (varlen steps) also the entries its rows complete: row b's are
    `entry_slots[entry_indptr[b] .. entry_indptr[b + 1]]` (arena slot `page * E + w % E`); in
    a decode step (fixed shapes) instead `entry_at`: per query slot, the arena slot of the
    entry that slot's token completes (-1: none; every group has it there, unread by others)."""

    slots: torch.Tensor
    page_indptr: torch.Tensor
    page_ids: torch.Tensor
    page_start: torch.Tensor
    entry_indptr: torch.Tensor | None = None
    entry_slots: torch.Tensor | None = None
    entry_at: torch.Tensor | None = None


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
class StateRows:
    """The State group of a step (linear-attention layers), int32 tensors: row b's query
    tokens are `query_indptr[b] .. query_indptr[b + 1]` (`token_row` maps each token back);
    it reads its checkpoint from state page `state_in[b]` (-1: zeros) and writes the state
    after its last token to `state_out[b]` (-1: nowhere, graph padding), and the state after
    its first `ckpt_len[c]` tokens to `ckpt_page[c]` for `c` in `ckpt_indptr[b] ..
    ckpt_indptr[b + 1]` (prefix-cache checkpoints; `ckpt_len` / `ckpt_page` hold at least one
    entry, unread past the last). `region` is the State region [state pages, page bytes]
    (uint8), each page one checkpoint of every linear layer."""

    region: torch.Tensor
    query_indptr: torch.Tensor
    token_row: torch.Tensor
    state_in: torch.Tensor
    state_out: torch.Tensor
    ckpt_indptr: torch.Tensor
    ckpt_len: torch.Tensor
    ckpt_page: torch.Tensor
    chunk_starts: dict[int, torch.Tensor] = field(default_factory=dict, compare=False)
    """Each row's first chunk of the chunked delta rule, by chunk size: filled by the step's
    first linear layer (`delta_rule._chunk_indptr`), read by the others."""

    def check(self) -> None:
        """Assert the dtypes and the row counts the kernels rely on."""
        batch = self.state_in.shape[0]
        for t in (self.query_indptr, self.token_row, self.state_in, self.state_out,
                  self.ckpt_indptr, self.ckpt_len, self.ckpt_page):  # fmt: skip
            assert t.dtype == torch.int32, "State row tensors are int32"
        assert self.state_out.shape[0] == batch and self.query_indptr.shape[0] == batch + 1
        assert self.ckpt_indptr.shape[0] == batch + 1 and self.ckpt_len.shape[0] >= 1
        assert self.ckpt_page.shape == self.ckpt_len.shape


@dataclass(frozen=True, slots=True)
class StepTensors:
    input_ids: torch.Tensor  # int32 [T]
    positions: torch.Tensor  # int32 [T]
    groups: tuple[GroupTensors, ...]
    info: DecodeInfo | PrefillInfo
    media: MediaTensors | None = None
    state: StateRows | None = None  # models with a State group (linear attention)
    states: tuple[StateRows, ...] = ()  # every State group, in order (varlen steps)
