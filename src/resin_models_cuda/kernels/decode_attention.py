# mypy: disable-error-code="untyped-decorator,no-untyped-def"
"""Paged decode attention: split-KV (flash-decoding) with GQA head grouping.

`Q` query tokens per row (1 for plain decode; 1 + k when a row verifies k speculative drafts),
the row's last `q_lens[b]` of them real, at the row's last positions (causal among them;
padding query slots repeat the last real one). Grid `(B, num_kv_heads, S)` is fixed for a given
batch size, query count and split count, so a CUDA graph replays it for any context lengths:
each program derives its KV range from the row's length at run time (an empty range writes an
empty partial). Every program loads each K/V tile once for all `Q * G` query rows of its KV
head (`G = num_q_heads // num_kv_heads`) and multiplies with `tl.dot` (padded to 16 rows); the
sweep over the pages is `paged.paged_attend`, shared with prefill. A second kernel merges the
S partials by their log-sum-exp. With one split (rows x KV heads already fill the GPU: batch
64 of an 8-KV-head model) there is nothing to merge: the partial kernel writes the output
itself (`DIRECT`), one launch and the float32 partials' round trip fewer per layer.

Sliding window (`window > 0`): the query at position p attends positions (p - window, p].
Attention sinks (gpt-oss, `sinks` [Hq]): one extra logit per head joins the softmax's
denominator (it takes probability mass but has no value); the merge adds it (with one split,
the partial kernel does).

The partial kernel's Triton `launch_metadata` (`kv_read_bytes`) counts the K/V tokens the rows
attend, not the whole arena it is handed (`resin bench runner --kernels`, proton).
"""

from __future__ import annotations

from typing import Any

import torch
import triton
import triton.language as tl

from resin_models_cuda.kernels.paged import PagedKV, next_pow2, paged_attend
from resin_models_cuda.kernels.pdl import pdl_args, pdl_enter

LOG2E = 1.4426950408889634
LOG2E_C = tl.constexpr(LOG2E)


def kv_read_bytes(grid: Any, metadata: Any, args: dict[str, Any]) -> dict[str, int]:
    """Triton's `launch_metadata` hook of the partial kernel, `(grid, metadata, {argument:
    value}) -> {"bytes": n}`: K and V of each row's attended tokens (its length, at most its
    window), read from the device, plus the other tensors (whole); inside a CUDA-graph capture,
    which cannot read the lengths, the whole K and V pages."""
    kv, lens, window = args["kv"], args["seq_lens_ptr"], int(args["window"])
    k = kv.k_cache
    if lens.is_cuda and torch.cuda.is_current_stream_capturing():
        kv_bytes = 2 * k.numel() * k.element_size()
    else:
        attended = lens.clamp(max=window) if window > 0 else lens
        kv_bytes = int(attended.sum()) * 2 * k.shape[2] * k.shape[3] * k.element_size()
    others = [args["q_ptr"], args["q_lens_ptr"], args["o_ptr"], args["lse_ptr"], lens,
              args["out_ptr"] if args.get("DIRECT") else None, kv.page_indptr, kv.page_ids,
              kv.page_start]  # fmt: skip
    rest = {t.data_ptr(): t.numel() * t.element_size() for t in others if t is not None}
    return {"bytes": kv_bytes + sum(rest.values())}


@triton.jit(launch_metadata=kv_read_bytes)
def _decode_partial_kernel(
    q_ptr,  # [B * Q, Hq, D], strides (q_strides[0], q_strides[1], 1)
    kv,  # PagedKV (paged.py): K/V [pages, PAGE, Hkv, D] and the page table
    kv_strides,  # PagedKV.strides
    seq_lens_ptr,  # int32 [B]: tokens in the cache, the queries' own included (0: padding row)
    q_lens_ptr,  # int32 [B]: real query tokens of the row (QUERY > 1; else None)
    o_ptr,  # fp32 [B * Q, Hq, S, D] contiguous: per-split normalized outputs (not DIRECT)
    lse_ptr,  # fp32 [B * Q, Hq, S] contiguous: per-split log2-sum-exp (-inf when empty)
    out_ptr,  # [B * Q, Hq, D], strides (o_strides[0], o_strides[1], 1) (DIRECT)
    sinks_ptr,  # fp32 [Hq]: sink logits (DIRECT with HAS_SINKS)
    q_strides,
    o_strides,
    qk_scale,  # softmax scale * log2(e)
    window,  # 0 = full attention
    NUM_Q_HEADS: tl.constexpr,
    GROUP: tl.constexpr,
    QUERY: tl.constexpr,
    ROWS_PAD: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    PAGE: tl.constexpr,
    BLOCK_N: tl.constexpr,
    SPLITS: tl.constexpr,
    DIRECT: tl.constexpr,
    HAS_SINKS: tl.constexpr,
    PDL: tl.constexpr,
):
    pdl_enter(PDL)
    b = tl.program_id(0)
    kvh = tl.program_id(1)
    s = tl.program_id(2)
    seq_len = tl.load(seq_lens_ptr + b)
    r = tl.arange(0, ROWS_PAD)  # tile row = (query j, head g of the group)
    j = r // GROUP
    heads = kvh * GROUP + r % GROUP
    rmask = r < QUERY * GROUP
    n = 1  # real queries of the row
    if QUERY > 1:
        n = tl.maximum(tl.load(q_lens_ptr + b), 1)
    key_hi = seq_len - n + tl.minimum(j, n - 1) + 1  # causal per query; padding repeats the last
    key_lo = tl.where(window > 0, key_hi - window, 0)
    kv_lo = 0
    if window > 0:  # the first real query's window
        kv_lo = tl.maximum(seq_len - n + 1 - window, 0)
    per_split = tl.cdiv(tl.cdiv(seq_len - kv_lo, SPLITS), BLOCK_N) * BLOCK_N
    lo = kv_lo + s * per_split
    hi = tl.minimum(lo + per_split, seq_len)

    d = tl.arange(0, HEAD_DIM)
    tok_q = b * QUERY + j
    q = tl.load(
        q_ptr + tok_q[:, None] * q_strides[0] + heads[:, None] * q_strides[1] + d[None, :],
        mask=rmask[:, None],
        other=0.0,
    )
    acc, m_i, l_i = paged_attend(
        q, kv, kv_strides, b, kvh, lo, hi, key_lo, key_hi, qk_scale,
        HEAD_DIM, PAGE, BLOCK_N,
    )  # fmt: skip
    empty = l_i == 0.0
    out_ptrs = out_ptr + tok_q[:, None] * o_strides[0] + heads[:, None] * o_strides[1] + d[None, :]
    if DIRECT:  # the whole sequence in this program: normalize and store the output
        total = l_i
        if HAS_SINKS:  # the sink's share of the denominator, exp2(sink - m) in the max's frame
            sink = tl.load(sinks_ptr + heads, mask=rmask, other=0.0).to(tl.float32) * LOG2E_C
            total += tl.exp2(sink - tl.where(empty, sink, m_i))
        out = acc / tl.where(total == 0.0, 1.0, total)[:, None]
        tl.store(out_ptrs, out.to(out_ptr.dtype.element_ty), mask=rmask[:, None])
    else:
        out = acc / tl.where(empty, 1.0, l_i)[:, None]
        lse = tl.where(empty, float("-inf"), m_i + tl.log2(tl.where(empty, 1.0, l_i)))
        rows = (tok_q * NUM_Q_HEADS + heads) * SPLITS
        tl.store(o_ptr + (rows + s)[:, None] * HEAD_DIM + d[None, :], out, mask=rmask[:, None])
        tl.store(lse_ptr + rows + s, lse, mask=rmask)


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
    PDL: tl.constexpr,
):
    pdl_enter(PDL)
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
    kv: PagedKV,
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
    num_warps: int = 4,
    num_stages: int = 2,
) -> torch.Tensor:
    """Attention of `query` tokens per row over the row's paged KV; returns `[B * query, Hq, D]`.

    `q` [B * query, Hq, D] (row b's tokens at `b * query ..`); `kv` the layer's pages (see
    `paged.py`); `seq_lens[b]` counts the row's cached tokens including its queries (their K/V
    must already be appended); with `query > 1`, `q_lens[b]` says how many of the row's query
    slots are real (they sit at the row's last positions). Rows with `seq_lens == 0` (graph
    padding) produce zeros. `block_n`, `num_warps`, `num_stages`: the
    partial kernel's launch shape (`resin bench decode-attention` sweeps them).
    """
    tokens, num_q_heads, head_dim = q.shape
    assert query >= 1 and tokens % query == 0
    batch = tokens // query
    kv.check(q, batch)
    if query > 1:
        assert q_lens is not None and q_lens.shape[0] >= batch, "query > 1 needs q_lens"
    for t in (seq_lens, q_lens if query > 1 else seq_lens):
        assert t is not None and t.dtype == torch.int32, "lengths are int32"
    assert seq_lens.shape[0] >= batch
    group = num_q_heads // kv.num_kv_heads
    if head_dim * q.element_size() > 512:  # e.g. float32 x 256: keep the tiles in shared memory
        block_n = min(block_n, 16)
    if out is None:
        out = torch.empty_like(q)
    assert out.shape == q.shape and out.stride(2) == 1
    if sinks is not None:
        assert sinks.shape == (num_q_heads,) and sinks.dtype == torch.float32
    direct = splits == 1
    o_part = lse = None
    if not direct:  # the splits' partials (module doc)
        o_part = torch.empty(
            (tokens, num_q_heads, splits, head_dim), dtype=torch.float32, device=q.device
        )
        lse = torch.empty((tokens, num_q_heads, splits), dtype=torch.float32, device=q.device)
    _decode_partial_kernel[(batch, kv.num_kv_heads, splits)](
        q, kv, kv.strides, seq_lens, q_lens, o_part, lse, out, sinks,
        (q.stride(0), q.stride(1)), (out.stride(0), out.stride(1)), scale * LOG2E, window,
        NUM_Q_HEADS=num_q_heads, GROUP=group, QUERY=query,
        ROWS_PAD=max(16, next_pow2(query * group)),
        HEAD_DIM=head_dim, PAGE=kv.page_size, BLOCK_N=block_n, SPLITS=splits,
        DIRECT=direct, HAS_SINKS=sinks is not None,
        num_warps=num_warps, num_stages=num_stages, **pdl_args(),
    )  # fmt: skip
    if direct:
        return out
    _decode_merge_kernel[(tokens, num_q_heads)](
        o_part, lse, out, lse if sinks is None else sinks, out.stride(0), out.stride(1),
        HAS_SINKS=sinks is not None,
        NUM_Q_HEADS=num_q_heads, HEAD_DIM=head_dim, SPLITS=splits,
        SPLITS_PAD=max(2, next_pow2(splits)), num_warps=4, **pdl_args(),
    )  # fmt: skip
    return out
