# mypy: disable-error-code="untyped-decorator,no-untyped-def"
"""Paged decode attention: split-KV (flash-decoding) with GQA head grouping.

`Q` query tokens per row (1 for plain decode; 1 + k when a row verifies k speculative drafts),
the row's last `q_lens[b]` of them real, at the row's last positions (causal among them;
padding query slots repeat the last real one). Grid `(B, num_kv_heads, S)` is fixed for a given
batch size, query count and split count, so a CUDA graph replays it for any context lengths:
each program derives its KV range from the row's length at run time (an empty range writes an
empty partial). Every program loads each K/V tile once for all `Q * G` query rows of its KV
head (`G = num_q_heads // num_kv_heads`) and multiplies with `tl.dot` (padded to 16 rows). A
second kernel merges the S partials by their log-sum-exp.

Sliding window (`window > 0`): the query at position p attends positions (p - window, p].
Attention sinks (gpt-oss, `sinks` [Hq]): one extra logit per head joins the softmax's
denominator (it takes probability mass but has no value); the merge adds it.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from resin_models_cuda.kernels.paged import check_cache, next_pow2

LOG2E = 1.4426950408889634


@triton.jit
def _decode_partial_kernel(
    q_ptr,  # [B * Q, Hq, D], strides (stride_qb, stride_qh, 1)
    k_ptr,  # [pages, PAGE, Hkv, D], strides (stride_kp, stride_kt, stride_kh, 1)
    v_ptr,  # same layout and strides as k
    page_indptr_ptr,  # int32 [B+1]
    page_ids_ptr,  # int32 [P]
    page_start_ptr,  # int32 [B]
    seq_lens_ptr,  # int32 [B]: tokens in the cache, the queries' own included (0: padding row)
    q_lens_ptr,  # int32 [B]: real query tokens of the row (read when QUERY > 1)
    o_ptr,  # fp32 [B * Q, Hq, S, D] contiguous: per-split normalized outputs
    lse_ptr,  # fp32 [B * Q, Hq, S] contiguous: per-split log2-sum-exp (-inf when empty)
    stride_qb,
    stride_qh,
    stride_kp,
    stride_kt,
    stride_kh,
    qk_scale,  # softmax scale * log2(e)
    window,  # 0 = full attention
    NUM_Q_HEADS: tl.constexpr,
    GROUP: tl.constexpr,
    QUERY: tl.constexpr,
    ROWS_PAD: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    PAGE: tl.constexpr,
    BLOCK_N: tl.constexpr,
    DOT_PRECISION: tl.constexpr,  # "ieee" for float32 inputs (no TF32 rounding)
    SPLITS: tl.constexpr,
):
    b = tl.program_id(0)
    kvh = tl.program_id(1)
    s = tl.program_id(2)
    seq_len = tl.load(seq_lens_ptr + b)
    r = tl.arange(0, ROWS_PAD)  # tile row = (query j, head g of the group)
    j = r // GROUP
    heads = kvh * GROUP + r % GROUP
    rmask = r < QUERY * GROUP
    if QUERY > 1:
        n = tl.maximum(tl.load(q_lens_ptr + b), 1)
        limit = seq_len - n + tl.minimum(j, n - 1) + 1  # keys < limit: causal per query
        first = seq_len - n + 1  # the first real query's limit
    else:
        limit = seq_len + 0 * r
        first = seq_len
    kv_lo = 0
    if window > 0:
        kv_lo = tl.maximum(first - window, 0)
    per_split = tl.cdiv(tl.cdiv(seq_len - kv_lo, SPLITS), BLOCK_N) * BLOCK_N
    lo = kv_lo + s * per_split
    hi = tl.minimum(lo + per_split, seq_len)

    d = tl.arange(0, HEAD_DIM)
    tok_q = b * QUERY + j
    q = tl.load(
        q_ptr + tok_q[:, None] * stride_qb + heads[:, None] * stride_qh + d[None, :],
        mask=rmask[:, None],
        other=0.0,
    )
    row_base = tl.load(page_indptr_ptr + b)
    page_start = tl.load(page_start_ptr + b)
    m_i = tl.full([ROWS_PAD], float("-inf"), tl.float32)
    l_i = tl.zeros([ROWS_PAD], tl.float32)
    acc = tl.zeros([ROWS_PAD, HEAD_DIM], tl.float32)
    for start in range(lo, hi, BLOCK_N):
        offs = start + tl.arange(0, BLOCK_N)
        nmask = offs < hi
        page = tl.load(page_ids_ptr + row_base + offs // PAGE - page_start, mask=nmask, other=0)
        tok = page.to(tl.int64) * stride_kp + (offs % PAGE) * stride_kt + kvh * stride_kh
        k = tl.load(k_ptr + tok[:, None] + d[None, :], mask=nmask[:, None], other=0.0)
        qk = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION).to(tl.float32) * qk_scale
        if QUERY > 1:
            keep = nmask[None, :] & (offs[None, :] < limit[:, None])
            if window > 0:
                keep &= offs[None, :] >= limit[:, None] - window
            qk = tl.where(keep, qk, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(qk, 1))
            m_new = tl.where(m_new == float("-inf"), 0.0, m_new)  # a query with no key yet
        else:
            qk = tl.where(nmask[None, :], qk, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(qk, 1))
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(qk - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        v = tl.load(v_ptr + tok[:, None] + d[None, :], mask=nmask[:, None], other=0.0)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=DOT_PRECISION).to(
            tl.float32
        )
        m_i = m_new
    empty = l_i == 0.0
    out = acc / tl.where(empty, 1.0, l_i)[:, None]
    lse = tl.where(empty, float("-inf"), m_i + tl.log2(tl.where(empty, 1.0, l_i)))
    part = (tok_q * NUM_Q_HEADS + heads) * SPLITS + s
    tl.store(o_ptr + part[:, None] * HEAD_DIM + d[None, :], out, mask=rmask[:, None])
    tl.store(lse_ptr + part, lse, mask=rmask)


@triton.jit
def _decode_merge_kernel(
    o_part_ptr,  # fp32 [B, Hq, S, D] contiguous
    lse_ptr,  # fp32 [B, Hq, S] contiguous
    out_ptr,  # [B, Hq, D], strides (stride_ob, stride_oh, 1)
    sinks_ptr,  # fp32 [Hq]: sink logits (read when HAS_SINKS)
    stride_ob,
    stride_oh,
    HAS_SINKS: tl.constexpr,
    NUM_Q_HEADS: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    SPLITS: tl.constexpr,
    SPLITS_PAD: tl.constexpr,
):
    b = tl.program_id(0)
    h = tl.program_id(1)
    s = tl.arange(0, SPLITS_PAD)
    d = tl.arange(0, HEAD_DIM)
    base = (b * NUM_Q_HEADS + h) * SPLITS
    lse = tl.load(lse_ptr + base + s, mask=s < SPLITS, other=float("-inf"))
    m = tl.max(lse, 0)
    if HAS_SINKS:
        sink = tl.load(sinks_ptr + h).to(tl.float32) * 1.4426950408889634
        m = tl.maximum(m, sink)
    m = tl.where(m == float("-inf"), 0.0, m)
    w = tl.exp2(lse - m)
    total = tl.sum(w, 0)
    if HAS_SINKS:
        total += tl.exp2(sink - m)
    o = tl.load(
        o_part_ptr + (base + s)[:, None] * HEAD_DIM + d[None, :], mask=(s < SPLITS)[:, None]
    )
    res = tl.sum(o * w[:, None], 0) / tl.where(total == 0.0, 1.0, total)
    tl.store(out_ptr + b * stride_ob + h * stride_oh + d, res.to(out_ptr.dtype.element_ty))


def decode_splits(batch: int, num_kv_heads: int, num_sms: int = 132, max_splits: int = 32) -> int:
    """KV splits per (row, KV head) so that about two waves of programs cover all SMs."""
    want = max(1, (2 * num_sms + batch * num_kv_heads - 1) // (batch * num_kv_heads))
    return min(max_splits, next_pow2(want))


def decode_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    page_indptr: torch.Tensor,
    page_ids: torch.Tensor,
    page_start: torch.Tensor,
    seq_lens: torch.Tensor,
    *,
    scale: float,
    splits: int,
    window: int = 0,
    sinks: torch.Tensor | None = None,
    out: torch.Tensor | None = None,
    block_n: int = 64,
    query: int = 1,
    q_lens: torch.Tensor | None = None,
) -> torch.Tensor:
    """Attention of `query` tokens per row over the row's paged KV; returns `[B * query, Hq, D]`.

    `q` [B * query, Hq, D] (row b's tokens at `b * query ..`); caches [pages, page_size, Hkv,
    D] (see `paged.py`); `seq_lens[b]` counts the row's cached tokens including its queries
    (their K/V must already be appended); with `query > 1`, `q_lens[b]` says how many of the
    row's query slots are real (they sit at the row's last positions). Rows with
    `seq_lens == 0` (graph padding) produce zeros.
    """
    check_cache(k_cache, "k_cache")
    assert k_cache.shape == v_cache.shape and k_cache.stride() == v_cache.stride()
    tokens, num_q_heads, head_dim = q.shape
    assert query >= 1 and tokens % query == 0
    batch = tokens // query
    num_kv_heads = k_cache.shape[2]
    assert q.stride(2) == 1 and head_dim == k_cache.shape[3]
    assert num_q_heads % num_kv_heads == 0
    assert head_dim == next_pow2(head_dim), "head_dim must be a power of two"
    if query > 1:
        assert q_lens is not None and q_lens.shape[0] >= batch, "query > 1 needs q_lens"
    for t in (page_indptr, page_ids, page_start, seq_lens, q_lens if query > 1 else seq_lens):
        assert t is not None and t.dtype == torch.int32, "page tables and lengths are int32"
    assert page_indptr.shape[0] >= batch + 1 and seq_lens.shape[0] >= batch
    group = num_q_heads // num_kv_heads
    if head_dim * q.element_size() > 512:  # e.g. float32 x 256: keep the tiles in shared memory
        block_n = min(block_n, 16)
    o_part = torch.empty(
        (tokens, num_q_heads, splits, head_dim), dtype=torch.float32, device=q.device
    )
    lse = torch.empty((tokens, num_q_heads, splits), dtype=torch.float32, device=q.device)
    if out is None:
        out = torch.empty_like(q)
    assert out.shape == q.shape and out.stride(2) == 1
    _decode_partial_kernel[(batch, num_kv_heads, splits)](
        q, k_cache, v_cache, page_indptr, page_ids, page_start, seq_lens,
        seq_lens if q_lens is None else q_lens, o_part, lse,
        q.stride(0), q.stride(1), k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        scale * LOG2E, window,
        NUM_Q_HEADS=num_q_heads, GROUP=group, QUERY=query,
        ROWS_PAD=max(16, next_pow2(query * group)),
        HEAD_DIM=head_dim, PAGE=k_cache.shape[1], BLOCK_N=block_n, SPLITS=splits,
        DOT_PRECISION="ieee" if q.dtype == torch.float32 else "tf32",
        num_warps=4, num_stages=2,
    )  # fmt: skip
    if sinks is not None:
        assert sinks.shape == (num_q_heads,) and sinks.dtype == torch.float32
    _decode_merge_kernel[(tokens, num_q_heads)](
        o_part, lse, out, lse if sinks is None else sinks, out.stride(0), out.stride(1),
        HAS_SINKS=sinks is not None,
        NUM_Q_HEADS=num_q_heads, HEAD_DIM=head_dim, SPLITS=splits,
        SPLITS_PAD=max(2, next_pow2(splits)), num_warps=4,
    )  # fmt: skip
    return out
