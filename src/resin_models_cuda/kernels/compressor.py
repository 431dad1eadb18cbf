# mypy: disable-error-code="untyped-decorator,no-untyped-def"
"""Gated pooling (DeepSeek-V4's compressor, GLM-5.3's indexer key pools): one entry pools its
`S` slots with a per-channel softmax, `out[e, c] = sum_s softmax_s(gate[e, s, c] + bias[s, c])
* kv[e, s, c]`. The softmax runs in float32 and its weights are rounded to the output dtype
before the weighted sum (as transformers does); a slot whose gate is -inf (CSA's first entry
has no previous block) weighs 0. One program pools one entry over a block of channels, every
slot at once (S <= 256: HCA's 128 tokens, CSA's 2 x 4, GLM's 16).

Two layouts (`PAGED`, a compile-time switch): `gated_pool` reads gathered slots [E, S, C]
(V4, whose entries pool a compressor's projections; its `kv_norm` and rotary follow as plain
ops); `paged_gated_pool` reads the tokens straight from a row's cache pages (GLM: pool w of row
b is its positions w S .. w S + S - 1, the indexer key and the gate score channels of the
History pages, `[B, E, C]` out with zeros past a row's complete pools), with no gather first."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from resin_models_cuda.kernels.paged import next_pow2
from resin_models_cuda.kernels.pdl import pdl_args, pdl_enter
from resin_models_cuda.kernels.sparse_attention import PagedKeys


@triton.jit
def _pool_kernel(
    kv_ptr,  # [E, S, C] contiguous; PAGED: pages [P, page size, >= C], strides (page, slot, 1)
    gate_ptr,  # [E, S, C] float32; PAGED: the same pages' gate channels, kv's strides
    bias_ptr,  # [S, C] float32
    out_ptr,  # [E, C]; PAGED: [B, E, C]
    page_stride,  # PAGED: kv's and gate's page and slot strides
    slot_stride,
    indptr,  # PAGED: int32 [B + 1], row b's pages ids[indptr[b] ..]
    ids,
    start,  # PAGED: int32 [B], the first held page of each row
    count_ptr,  # PAGED: int32 [B], the complete pools each row holds
    first_ptr,  # PAGED: int32 [B], the first pool of each row in the output
    E,  # PAGED: pools a row in the output
    page_size,
    S: tl.constexpr,
    C: tl.constexpr,
    BLOCK_S: tl.constexpr,
    BLOCK_C: tl.constexpr,
    PAGED: tl.constexpr,
    PDL: tl.constexpr,
):
    pdl_enter(PDL)
    e = tl.program_id(0).to(tl.int64)
    c = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
    s = tl.arange(0, BLOCK_S)
    mask = (s[:, None] < S) & (c[None, :] < C)
    if PAGED:
        row = e // E
        w = tl.load(first_ptr + row) + e % E
        slots = tl.where(w < tl.load(count_ptr + row), S, 0)  # none past the complete pools
        mask = (s[:, None] < slots) & (c[None, :] < C)
        kpos = w * S + s
        page = tl.load(ids + tl.load(indptr + row) + kpos // page_size - tl.load(start + row),
                       mask=s < slots, other=0).to(tl.int64)  # fmt: skip
        at = (page * page_stride + (kpos % page_size) * slot_stride)[:, None] + c[None, :]
        gate = tl.load(gate_ptr + at, mask=mask, other=float("-inf")).to(tl.float32)
    else:
        at = (e * S + s[:, None]) * C + c[None, :]
        gate = tl.load(gate_ptr + at, mask=mask, other=float("-inf"))
    gate += tl.load(bias_ptr + s[:, None] * C + c[None, :], mask=mask, other=0.0)
    gate = tl.where(mask, gate, float("-inf"))
    top = tl.max(gate, 0)
    top = tl.where(top > float("-inf"), top, 0.0)  # a padding channel has no finite gate
    e_ = tl.where(mask, tl.exp(gate - top[None, :]), 0.0)
    total = tl.maximum(tl.sum(e_, 0), 1e-30)  # >= 1 on a real channel
    dtype = out_ptr.dtype.element_ty
    weights = (e_ / total[None, :]).to(dtype).to(tl.float32)
    kv = tl.load(kv_ptr + at, mask=mask, other=0.0).to(tl.float32)
    pooled = tl.sum(tl.where(mask, weights * kv, 0.0), 0)
    tl.store(out_ptr + e * C + c, pooled.to(dtype), mask=c < C)


def gated_pool(kv: torch.Tensor, gate: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """[E, C] in kv's dtype: each entry's slots `kv` [E, S, C] pooled with the softmax over
    slots of `gate` [E, S, C] (float32, -inf for an empty slot) plus `bias` [S, C]."""
    entries, slots, channels = kv.shape
    assert gate.shape == kv.shape and bias.shape == (slots, channels)
    out = torch.empty((entries, channels), dtype=kv.dtype, device=kv.device)
    if entries:
        block_c = min(64, next_pow2(channels))
        grid = (entries, triton.cdiv(channels, block_c))
        none = torch.zeros(1, dtype=torch.int32, device=kv.device)
        _pool_kernel[grid](
            kv.contiguous(), gate.float().contiguous(), bias.float().contiguous(), out, 0, 0,
            none, none, none, none, none, entries, 1,
            S=slots, C=channels, BLOCK_S=next_pow2(slots), BLOCK_C=block_c, PAGED=False,
            **pdl_args(),
        )  # fmt: skip
    return out


def paged_gated_pool(
    kv: PagedKeys,
    gate: torch.Tensor,
    bias: torch.Tensor,
    counts: torch.Tensor,
    pools: int,
    first: torch.Tensor | None = None,
) -> torch.Tensor:
    """[B, pools, C] in the pages' dtype: row b's pools w = first[b] + i, i < pools (first
    None: 0), those below counts[b] (B = counts' length) of S = bias.shape[0] tokens each,
    positions w S .. w S + S - 1 of its pages `kv` ([P, page size, C] strided, last stride 1,
    with its page table), each pooled as `gated_pool` does with the gate scores `gate` (a view
    of the same pages: kv's shape and strides, any float dtype, softmax in float32) plus
    `bias` [S, C]; zeros from counts[b] on. `pools` is fixed by the caller (a decode step's
    bound, not the rows'), so a CUDA graph replays it. `first` (int32 [B], >= 0) pools only
    the entries a step completes (GLM-5.3's stored pools: `first[b]` the row's complete pools
    before the step)."""
    pages = kv.pages
    slots, channels = bias.shape
    assert pages.dim() == 3 and pages.shape[2] == channels and pages.stride(2) == 1
    assert gate.shape == pages.shape and gate.stride() == pages.stride()
    assert kv.start is not None and kv.indptr.shape[0] == counts.shape[0] + 1
    rows = counts.shape[0]
    if first is None:
        first = torch.zeros_like(counts)
    assert first.shape == counts.shape
    out = torch.empty((rows, pools, channels), dtype=pages.dtype, device=pages.device)
    if rows and pools:
        block_c = min(64, next_pow2(channels))
        grid = (rows * pools, triton.cdiv(channels, block_c))
        _pool_kernel[grid](
            pages, gate, bias.float().contiguous(), out, pages.stride(0), pages.stride(1),
            kv.indptr.int(), kv.ids.int(), kv.start.int(), counts.int(), first.int(), pools,
            pages.shape[1],
            S=slots, C=channels, BLOCK_S=next_pow2(slots), BLOCK_C=block_c, PAGED=True,
            **pdl_args(),
        )  # fmt: skip
    return out
