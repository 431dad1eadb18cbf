# mypy: disable-error-code="untyped-decorator,no-untyped-def"
"""Paged prefill attention over a cached prefix: causal, chunked, varlen, optional window.

Row i's `q_len` query tokens sit at positions `cached_len .. cached_len + q_len - 1`; their
K/V must already be appended to the cache, so the kernel reads the cached prefix and the new
chunk the same way, from pages. Program `(block, head)` handles `BLOCK_M` query tokens of one
row (the host maps blocks to rows with `prefill_blocks`) and walks KV tiles up to its last
query position (causal) with the online softmax it shares with decode (`paged.paged_attend`).

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

from resin_models_cuda.kernels.paged import PagedKV, paged_attend
from resin_models_cuda.kernels.pdl import pdl_args, pdl_enter

LOG2E = 1.4426950408889634


@triton.jit
def _prefill_kernel(
    q_ptr,  # [T, Hq, D], strides (q_strides[0], q_strides[1], 1)
    kv,  # PagedKV (paged.py): K/V [pages, PAGE, Hkv, D] and the page table
    kv_strides,  # PagedKV.strides
    o_ptr,  # [T, Hq, D], strides (o_strides[0], o_strides[1], 1)
    query_indptr_ptr,  # int32 [B+1]
    cached_lens_ptr,  # int32 [B]
    block_row_ptr,  # int32 [NB]: row of each query block
    block_off_ptr,  # int32 [NB]: first query index of the block inside its row
    sinks_ptr,  # fp32 [Hq]: sink logits, or None
    span_end_ptr,  # int32 [T]: last visible key of each query inside a span, or None
    q_strides,
    o_strides,
    qk_scale,  # softmax scale * log2(e)
    window,  # 0 = full attention
    GROUP: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    PAGE: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    PDL: tl.constexpr,
):
    pdl_enter(PDL)
    blk = tl.program_id(0)
    h = tl.program_id(1)
    row = tl.load(block_row_ptr + blk)
    q_off = tl.load(block_off_ptr + blk)
    q_begin = tl.load(query_indptr_ptr + row)
    q_len = tl.load(query_indptr_ptr + row + 1) - q_begin
    cached = tl.load(cached_lens_ptr + row)

    m_idx = q_off + tl.arange(0, BLOCK_M)
    mmask = m_idx < q_len
    q_pos = cached + m_idx
    d = tl.arange(0, HEAD_DIM)
    tok_q = (q_begin + m_idx).to(tl.int64)
    q = tl.load(
        q_ptr + tok_q[:, None] * q_strides[0] + h * q_strides[1] + d[None, :],
        mask=mmask[:, None],
        other=0.0,
    )
    kv_hi = cached + tl.minimum(q_off + BLOCK_M, q_len)
    limit = q_pos  # last key each query sees
    if span_end_ptr is not None:
        span = tl.load(span_end_ptr + tok_q, mask=mmask, other=-1)
        limit = tl.maximum(q_pos, span)
        kv_hi = tl.minimum(tl.maximum(kv_hi, tl.max(span, 0) + 1), cached + q_len)
    kv_lo = tl.load(kv.page_start + row) * PAGE  # the row's first page held
    if window > 0:
        kv_lo = tl.maximum(kv_lo, cached + q_off - window + 1)
    key_lo = tl.where(window > 0, q_pos - window + 1, 0)
    acc, m_i, l_i = paged_attend(
        q, kv, kv_strides, row, h // GROUP, kv_lo, kv_hi, key_lo, limit + 1, qk_scale,
        HEAD_DIM, PAGE, BLOCK_N,
    )  # fmt: skip
    if sinks_ptr is not None:
        sink = tl.load(sinks_ptr + h).to(tl.float32) * 1.4426950408889634
        m_safe = tl.where(m_i == float("-inf"), sink, m_i)
        # Rescale to a common maximum so a large sink cannot overflow exp2.
        m_all = tl.maximum(m_safe, sink)
        scale_acc = tl.exp2(m_safe - m_all)
        acc = acc * scale_acc[:, None]
        l_i = l_i * scale_acc + tl.exp2(sink - m_all)
    out = acc / tl.where(l_i == 0.0, 1.0, l_i)[:, None]
    tl.store(
        o_ptr + tok_q[:, None] * o_strides[0] + h * o_strides[1] + d[None, :],
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
    kv: PagedKV,
    query_indptr: torch.Tensor,
    cached_lens: torch.Tensor,
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
    """Causal attention of flat query tokens `q` [T, Hq, D] over each row's paged KV `kv`.

    `block_row` / `block_off` come from `prefill_blocks(query_indptr, block_m)` (same block_m);
    `span_end` [T] int32 widens each query's causal limit to the end of its span (module doc).
    """
    _, num_q_heads, head_dim = q.shape
    kv.check(q, query_indptr.shape[0] - 1)
    for t in (query_indptr, cached_lens, block_row, block_off):
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
        q, kv, kv.strides, out, query_indptr, cached_lens, block_row, block_off,
        sinks, span_end, (q.stride(0), q.stride(1)), (out.stride(0), out.stride(1)),
        scale * LOG2E, window,
        GROUP=num_q_heads // kv.num_kv_heads, HEAD_DIM=head_dim, PAGE=kv.page_size,
        BLOCK_M=block_m, BLOCK_N=block_n, num_warps=4 if block_m <= 64 else 8, num_stages=2,
        **pdl_args(),
    )  # fmt: skip
    return out
