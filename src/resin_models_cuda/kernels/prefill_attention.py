# mypy: disable-error-code="untyped-decorator,no-untyped-def"
"""Paged prefill attention over a cached prefix: causal, chunked, varlen, optional window.

Row i's `q_len` query tokens sit at positions `cached_len .. cached_len + q_len - 1`; their
K/V must already be appended to the cache, so the kernel reads the cached prefix and the new
chunk the same way, from pages. Program `(block, head)` handles `BLOCK_M` query tokens of one
row (the host maps blocks to rows with `prefill_blocks`) and walks KV tiles up to its last
query position (causal) with an online softmax.

With `span_end` (int32 per flat query token: the sequence position of the last token of the
bidirectional span the token sits in, -1 outside spans) a query at position q sees keys up to
max(q, span_end): an image's tokens attend to each other both ways (Gemma 3); a window still
bounds keys from below (transformers: AND(window, OR(causal, same image))). A span must lie
within its row's chunk (the engine never cuts one).
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt
import torch
import triton
import triton.language as tl

from resin_models_cuda.kernels.paged import check_cache, next_pow2

LOG2E = 1.4426950408889634


@triton.jit
def _prefill_kernel(
    q_ptr,  # [T, Hq, D], strides (stride_qt, stride_qh, 1)
    k_ptr,  # [pages, PAGE, Hkv, D], strides (stride_kp, stride_kt, stride_kh, 1)
    v_ptr,  # same layout and strides as k
    o_ptr,  # [T, Hq, D], strides (stride_ot, stride_oh, 1)
    query_indptr_ptr,  # int32 [B+1]
    cached_lens_ptr,  # int32 [B]
    page_indptr_ptr,  # int32 [B+1]
    page_ids_ptr,  # int32 [P]
    page_start_ptr,  # int32 [B]
    block_row_ptr,  # int32 [NB]: row of each query block
    block_off_ptr,  # int32 [NB]: first query index of the block inside its row
    sinks_ptr,  # fp32 [Hq]: sink logits (read when HAS_SINKS)
    span_end_ptr,  # int32 [T]: last visible key of each query inside a span (HAS_SPANS)
    stride_qt,
    stride_qh,
    stride_kp,
    stride_kt,
    stride_kh,
    stride_ot,
    stride_oh,
    qk_scale,  # softmax scale * log2(e)
    window,  # 0 = full attention
    HAS_SINKS: tl.constexpr,
    HAS_SPANS: tl.constexpr,
    GROUP: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    PAGE: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    DOT_PRECISION: tl.constexpr,  # "ieee" for float32 inputs (no TF32 rounding)
):
    blk = tl.program_id(0)
    h = tl.program_id(1)
    kvh = h // GROUP
    row = tl.load(block_row_ptr + blk)
    q_off = tl.load(block_off_ptr + blk)
    q_begin = tl.load(query_indptr_ptr + row)
    q_len = tl.load(query_indptr_ptr + row + 1) - q_begin
    cached = tl.load(cached_lens_ptr + row)
    row_base = tl.load(page_indptr_ptr + row)
    page_start = tl.load(page_start_ptr + row)

    m_idx = q_off + tl.arange(0, BLOCK_M)
    mmask = m_idx < q_len
    q_pos = cached + m_idx
    d = tl.arange(0, HEAD_DIM)
    tok_q = (q_begin + m_idx).to(tl.int64)
    q = tl.load(
        q_ptr + tok_q[:, None] * stride_qt + h * stride_qh + d[None, :],
        mask=mmask[:, None],
        other=0.0,
    )
    kv_hi = cached + tl.minimum(q_off + BLOCK_M, q_len)
    limit = q_pos  # last key each query sees
    if HAS_SPANS:
        span = tl.load(span_end_ptr + tok_q, mask=mmask, other=-1)
        limit = tl.maximum(q_pos, span)
        kv_hi = tl.minimum(tl.maximum(kv_hi, tl.max(span, 0) + 1), cached + q_len)
    kv_lo = page_start * PAGE
    if window > 0:
        kv_lo = tl.maximum(kv_lo, cached + q_off - window + 1)
    kv_lo = (kv_lo // BLOCK_N) * BLOCK_N

    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)
    for start in range(kv_lo, kv_hi, BLOCK_N):
        offs = start + tl.arange(0, BLOCK_N)
        nmask = (offs < kv_hi) & (offs >= page_start * PAGE)
        page = tl.load(page_ids_ptr + row_base + offs // PAGE - page_start, mask=nmask, other=0)
        tok = page.to(tl.int64) * stride_kp + (offs % PAGE) * stride_kt + kvh * stride_kh
        k = tl.load(k_ptr + tok[:, None] + d[None, :], mask=nmask[:, None], other=0.0)
        qk = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION).to(tl.float32) * qk_scale
        keep = nmask[None, :] & (offs[None, :] <= limit[:, None])
        if window > 0:
            keep = keep & (offs[None, :] > q_pos[:, None] - window)
        qk = tl.where(keep, qk, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(qk, 1))
        # Rows whose whole tile is masked keep m = -inf; shift by 0 then to avoid inf - inf.
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        alpha = tl.exp2(m_i - m_safe)
        p = tl.exp2(qk - m_safe[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        v = tl.load(v_ptr + tok[:, None] + d[None, :], mask=nmask[:, None], other=0.0)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=DOT_PRECISION).to(
            tl.float32
        )
        m_i = m_new
    if HAS_SINKS:
        sink = tl.load(sinks_ptr + h).to(tl.float32) * 1.4426950408889634
        m_safe = tl.where(m_i == float("-inf"), sink, m_i)
        # Rescale to a common maximum so a large sink cannot overflow exp2.
        m_all = tl.maximum(m_safe, sink)
        scale_acc = tl.exp2(m_safe - m_all)
        acc = acc * scale_acc[:, None]
        l_i = l_i * scale_acc + tl.exp2(sink - m_all)
    out = acc / tl.where(l_i == 0.0, 1.0, l_i)[:, None]
    tl.store(
        o_ptr + tok_q[:, None] * stride_ot + h * stride_oh + d[None, :],
        out.to(o_ptr.dtype.element_ty),
        mask=mmask[:, None],
    )


def prefill_blocks(
    query_indptr: npt.NDArray[np.int32], block_m: int
) -> tuple[npt.NDArray[np.int32], npt.NDArray[np.int32]]:
    """Map query blocks to rows on the host: (block_row, block_offset), vectorized."""
    q_lens = query_indptr[1:].astype(np.int64) - query_indptr[:-1]
    nblocks = (q_lens + block_m - 1) // block_m
    block_row = np.repeat(np.arange(q_lens.shape[0], dtype=np.int32), nblocks)
    first = np.cumsum(nblocks) - nblocks
    block_off = (np.arange(block_row.shape[0]) - np.repeat(first, nblocks)) * block_m
    return block_row, block_off.astype(np.int32)


def prefill_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    query_indptr: torch.Tensor,
    cached_lens: torch.Tensor,
    page_indptr: torch.Tensor,
    page_ids: torch.Tensor,
    page_start: torch.Tensor,
    block_row: torch.Tensor,
    block_off: torch.Tensor,
    *,
    scale: float,
    window: int = 0,
    sinks: torch.Tensor | None = None,
    span_end: torch.Tensor | None = None,
    out: torch.Tensor | None = None,
    block_m: int = 64,
    block_n: int = 64,
) -> torch.Tensor:
    """Causal attention of flat query tokens `q` [T, Hq, D] over each row's paged KV.

    `block_row` / `block_off` come from `prefill_blocks(query_indptr, block_m)` (same block_m);
    `span_end` [T] int32 widens each query's causal limit to the end of its span (module doc).
    """
    check_cache(k_cache, "k_cache")
    assert k_cache.shape == v_cache.shape and k_cache.stride() == v_cache.stride()
    _, num_q_heads, head_dim = q.shape
    num_kv_heads = k_cache.shape[2]
    assert q.stride(2) == 1 and head_dim == k_cache.shape[3]
    assert num_q_heads % num_kv_heads == 0
    assert head_dim == next_pow2(head_dim), "head_dim must be a power of two"
    for t in (query_indptr, cached_lens, page_indptr, page_ids, page_start, block_row, block_off):
        assert t.dtype == torch.int32, "indices are int32"
    assert block_row.shape == block_off.shape
    if out is None:
        out = torch.empty_like(q)
    assert out.shape == q.shape and out.stride(2) == 1
    num_blocks = block_row.shape[0]
    if num_blocks == 0:
        return out
    if head_dim * q.element_size() > 512:  # e.g. float32 x 256: keep the tiles in shared memory
        block_n = min(block_n, 32)
    if sinks is not None:
        assert sinks.shape == (num_q_heads,) and sinks.dtype == torch.float32
    if span_end is not None:
        assert span_end.shape == (q.shape[0],) and span_end.dtype == torch.int32
    _prefill_kernel[(num_blocks, num_q_heads)](
        q, k_cache, v_cache, out, query_indptr, cached_lens, page_indptr, page_ids, page_start,
        block_row, block_off, block_row if sinks is None else sinks,
        block_row if span_end is None else span_end,
        q.stride(0), q.stride(1), k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        out.stride(0), out.stride(1), scale * LOG2E, window, HAS_SINKS=sinks is not None,
        HAS_SPANS=span_end is not None,
        GROUP=num_q_heads // num_kv_heads, HEAD_DIM=head_dim, PAGE=k_cache.shape[1],
        BLOCK_M=block_m, BLOCK_N=block_n,
        DOT_PRECISION="ieee" if q.dtype == torch.float32 else "tf32",
        num_warps=4 if block_m <= 64 else 8, num_stages=2,
    )  # fmt: skip
    return out
