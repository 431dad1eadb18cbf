# mypy: disable-error-code="untyped-decorator,no-untyped-def"
"""DeepSeek MLA kernels over the paged latent cache (one `[C + R]` vector per token per layer:
the normed KV latent, C = kv_lora_rank, then the rotated shared rotary key, R = rope dim).

- `latent_append`: store each token's latent at its append slot (slot -1: padding, skipped).
- `mla_decode`: absorbed decode attention, one query token per row. The query arrives already
  absorbed, `q_nope @ W_uk` (C) and `q_rope` (R) per head, read where they lie (no
  concatenation), so a score is `[q_latent ; q_rope] . entry` over the whole vector and the
  output is `sum p * latent` (C); `W_uv` is applied after. Split-KV like
  `decode_attention` (grid `(B, head blocks, S)`, fixed for a batch size: CUDA-graph safe),
  each program loads a latent tile once for a block of 16 heads; the same merge kernel
  combines the splits by their log-sum-exp, and as there, one split writes the output
  directly.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from resin_models_cuda.kernels.decode_attention import LOG2E, _decode_merge_kernel
from resin_models_cuda.kernels.paged import next_pow2
from resin_models_cuda.kernels.pdl import pdl_args, pdl_enter

HEAD_BLOCK = 16  # query heads per program (tl.dot needs at least 16 rows)


@triton.jit
def _latent_append_kernel(
    x_ptr,  # [T, W], strides (stride_xt, 1)
    cache_ptr,  # [pages, PAGE, 1, W], strides (stride_cp, stride_ct, ., 1)
    slots_ptr,  # int [T]: page * PAGE + offset, -1 = skip
    stride_xt,
    stride_cp,
    stride_ct,
    WIDTH: tl.constexpr,
    WIDTH_PAD: tl.constexpr,
    PAGE: tl.constexpr,
    PDL: tl.constexpr,
):
    pdl_enter(PDL)
    t = tl.program_id(0)
    slot = tl.load(slots_ptr + t).to(tl.int64)
    if slot >= 0:
        w = tl.arange(0, WIDTH_PAD)
        mask = w < WIDTH
        x = tl.load(x_ptr + t * stride_xt + w, mask=mask)
        at = (slot // PAGE) * stride_cp + (slot % PAGE) * stride_ct
        tl.store(cache_ptr + at + w, x.to(cache_ptr.dtype.element_ty), mask=mask)


def latent_append(x: torch.Tensor, cache: torch.Tensor, slots: torch.Tensor) -> None:
    """Store `x` [T, W] at `slots` [T] of `cache` [pages, page_size, 1, W] (in place)."""
    assert cache.dim() == 4 and cache.shape[2] == 1 and cache.stride(3) == 1
    assert x.dim() == 2 and x.shape[1] == cache.shape[3] and x.stride(1) == 1
    assert slots.shape[0] >= x.shape[0]
    if x.shape[0] == 0:
        return
    width = x.shape[1]
    _latent_append_kernel[(x.shape[0],)](
        x, cache, slots, x.stride(0), cache.stride(0), cache.stride(1),
        WIDTH=width, WIDTH_PAD=next_pow2(width), PAGE=cache.shape[1], num_warps=4, **pdl_args(),
    )  # fmt: skip


@triton.jit
def _mla_decode_partial_kernel(
    q_ptr,  # [B, H, C], strides (stride_qb, stride_qh, 1): the absorbed q_nope
    qr_ptr,  # [B, H, R], strides (stride_rb, stride_rh, 1): the rotated q_rope
    cache_ptr,  # [pages, PAGE, 1, C + R], strides (stride_cp, stride_ct, ., 1)
    page_indptr_ptr,  # int32 [B+1]
    page_ids_ptr,  # int32 [P]
    page_start_ptr,  # int32 [B]
    seq_lens_ptr,  # int32 [B]: cached tokens, the query's own included (0: padding row)
    o_ptr,  # fp32 [B, H, S, C] contiguous: per-split normalized latent outputs (not DIRECT)
    lse_ptr,  # fp32 [B, H, S] contiguous: per-split log2-sum-exp (-inf when empty)
    out_ptr,  # [B, H, C], strides (stride_ob, stride_oh, 1) (DIRECT)
    stride_qb,
    stride_qh,
    stride_rb,
    stride_rh,
    stride_cp,
    stride_ct,
    stride_ob,
    stride_oh,
    qk_scale,  # softmax scale * log2(e)
    NUM_HEADS: tl.constexpr,
    HEADS: tl.constexpr,  # HEAD_BLOCK
    LATENT: tl.constexpr,  # C, a power of two
    ROPE: tl.constexpr,  # R, a power of two
    PAGE: tl.constexpr,
    BLOCK_N: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    SPLITS: tl.constexpr,
    DIRECT: tl.constexpr,
    PDL: tl.constexpr,
):
    pdl_enter(PDL)
    b = tl.program_id(0)
    hb = tl.program_id(1)
    s = tl.program_id(2)
    seq_len = tl.load(seq_lens_ptr + b)
    per_split = tl.cdiv(tl.cdiv(seq_len, SPLITS), BLOCK_N) * BLOCK_N
    lo = s * per_split
    hi = tl.minimum(lo + per_split, seq_len)

    heads = hb * HEADS + tl.arange(0, HEADS)
    hmask = heads < NUM_HEADS
    c = tl.arange(0, LATENT)
    r = tl.arange(0, ROPE)
    q_row = q_ptr + b * stride_qb + heads[:, None] * stride_qh
    q_c = tl.load(q_row + c[None, :], mask=hmask[:, None], other=0.0)
    qr_row = qr_ptr + b * stride_rb + heads[:, None] * stride_rh
    q_r = tl.load(qr_row + r[None, :], mask=hmask[:, None], other=0.0)
    row_base = tl.load(page_indptr_ptr + b)
    page_start = tl.load(page_start_ptr + b)
    m_i = tl.full([HEADS], float("-inf"), tl.float32)
    l_i = tl.zeros([HEADS], tl.float32)
    acc = tl.zeros([HEADS, LATENT], tl.float32)
    for start in range(lo, hi, BLOCK_N):
        offs = start + tl.arange(0, BLOCK_N)
        nmask = offs < hi
        page = tl.load(page_ids_ptr + row_base + offs // PAGE - page_start, mask=nmask, other=0)
        tok = page.to(tl.int64) * stride_cp + (offs % PAGE) * stride_ct
        k_c = tl.load(cache_ptr + tok[:, None] + c[None, :], mask=nmask[:, None], other=0.0)
        k_r = tl.load(
            cache_ptr + tok[:, None] + LATENT + r[None, :], mask=nmask[:, None], other=0.0
        )
        qk = tl.dot(q_c, tl.trans(k_c), input_precision=DOT_PRECISION).to(tl.float32)
        qk += tl.dot(q_r, tl.trans(k_r), input_precision=DOT_PRECISION).to(tl.float32)
        qk = tl.where(nmask[None, :], qk * qk_scale, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(qk, 1))
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(qk - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        pv = tl.dot(p.to(k_c.dtype), k_c, input_precision=DOT_PRECISION).to(tl.float32)
        acc = acc * alpha[:, None] + pv
        m_i = m_new
    empty = l_i == 0.0
    out = acc / tl.where(empty, 1.0, l_i)[:, None]
    out_ptrs = out_ptr + b * stride_ob + heads[:, None] * stride_oh + c[None, :]
    if DIRECT:
        tl.store(out_ptrs, out.to(out_ptr.dtype.element_ty), mask=hmask[:, None])
    else:
        lse = tl.where(empty, float("-inf"), m_i + tl.log2(tl.where(empty, 1.0, l_i)))
        part = (b * NUM_HEADS + heads) * SPLITS + s
        tl.store(o_ptr + part[:, None] * LATENT + c[None, :], out, mask=hmask[:, None])
        tl.store(lse_ptr + part, lse, mask=hmask)


def mla_decode(
    q_latent: torch.Tensor,
    q_rope: torch.Tensor,
    cache: torch.Tensor,
    page_indptr: torch.Tensor,
    page_ids: torch.Tensor,
    page_start: torch.Tensor,
    seq_lens: torch.Tensor,
    *,
    scale: float,
    splits: int,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """Absorbed MLA attention of one query per row over its paged latents; returns the latent
    output `[B, H, C]` (the query's own latent must already be appended).

    `q_latent` [B, H, C] (`q_nope @ W_uk`) and `q_rope` [B, H, R], any row and head strides;
    `cache` [pages, page_size, 1, C + R]; `seq_lens[b]` counts the row's cached tokens
    including the query (0: padding, zeros out). `out` may be any [B, H, C] view with
    contiguous rows (e.g. a head-major buffer for the batched `W_uv` product after).
    """
    assert cache.dim() == 4 and cache.shape[2] == 1 and cache.stride(3) == 1
    batch, num_heads, latent = q_latent.shape
    rope = q_rope.shape[2]
    assert q_rope.shape[:2] == (batch, num_heads) and q_latent.stride(2) == q_rope.stride(2) == 1
    assert latent + rope == cache.shape[3]
    assert latent == next_pow2(latent) and rope == next_pow2(rope), "C and R: powers of two"
    for t in (page_indptr, page_ids, page_start, seq_lens):
        assert t.dtype == torch.int32, "page tables and lengths are int32"
    dtype, device = q_latent.dtype, q_latent.device
    block_n = 16 if q_latent.element_size() == 4 else 32  # a [BLOCK_N, C] tile in shared memory
    if out is None:
        out = torch.empty((batch, num_heads, latent), dtype=dtype, device=device)
    assert out.shape == (batch, num_heads, latent) and out.stride(2) == 1
    grid = (batch, triton.cdiv(num_heads, HEAD_BLOCK), splits)
    direct = splits == 1
    o_part = lse = None
    if not direct:
        o_part = torch.empty((batch, num_heads, splits, latent), dtype=torch.float32,
                             device=device)  # fmt: skip
        lse = torch.empty((batch, num_heads, splits), dtype=torch.float32, device=device)
    _mla_decode_partial_kernel[grid](
        q_latent, q_rope, cache, page_indptr, page_ids, page_start, seq_lens, o_part, lse,
        out,
        q_latent.stride(0), q_latent.stride(1), q_rope.stride(0), q_rope.stride(1),
        cache.stride(0), cache.stride(1), out.stride(0), out.stride(1), scale * LOG2E,
        NUM_HEADS=num_heads, HEADS=HEAD_BLOCK, LATENT=latent, ROPE=rope,
        PAGE=cache.shape[1], BLOCK_N=block_n, SPLITS=splits, DIRECT=direct,
        DOT_PRECISION="ieee" if dtype == torch.float32 else "tf32",
        num_warps=8, num_stages=2, **pdl_args(),
    )  # fmt: skip
    if direct:
        return out
    _decode_merge_kernel[(batch, num_heads)](
        o_part, lse, out, lse, out.stride(0), out.stride(1),
        HAS_SINKS=False, NUM_Q_HEADS=num_heads, HEAD_DIM=latent, SPLITS=splits,
        SPLITS_PAD=max(2, next_pow2(splits)), num_warps=4, **pdl_args(),
    )  # fmt: skip
    return out
