# mypy: disable-error-code="untyped-decorator,no-untyped-def"
"""Sparse multi-query attention: one shared key head (`D` wide) read by every query head, over
two key sets per query token at position p, in one of two modes (`POOL`, a compile-time switch).

DeepSeek-V4 (`sparse_attention`, POOL = 0): K = V (512 wide), and

* the sliding window: positions (p - window, p] of the row's Window-group pages;
* compressed entries of the row's Compressed-group pages: either the entries a CSA indexer
  selected (`selected` [T, K]: entry numbers, -1 for none) or, for HCA, every entry the query
  may see (`w < min(count, (p + 1) // ratio)`);
* a per-head sink logit in the softmax's denominator (probability mass with no value).

Pooled selection over token pages (`pooled_sparse_attention`, POOL = P >= 1; GLM-5.3's indexed
MLA, absorbed: the queries are in latent space, a key is a token's `[latent | rope]` and its
value the latent, the first `DV` channels):

* the selected entries are pools of P consecutive tokens of the row's key pages (`selected`
  [T, K]: pool numbers, -1 for none; entry w is positions w P .. w P + P - 1);
* the window is the query's own incomplete pool, positions (p + 1) - (p + 1) % P .. p (the
  tail, at most P - 1 tokens; never a selected pool, which the indexer only picks complete);
* no sink (optional in either mode), the softmax scale an argument.

Every token is one query row with its own position, so one launch serves decode and varlen
prefill alike. Grid `(T, head blocks, S)`: program s takes the s-th share of the window's keys
and of the entries' (flash-decoding), so a batch of few tokens still fills the GPU; each key
tile is loaded once for a block of heads and multiplied with `tl.dot`. With S > 1 a second
kernel merges the partial (max, sum, accumulator) triples; the sink joins split 0's state from
the start, so the merge needs no special case. The grid depends on T, the heads and S only, so
a CUDA graph replays it for any positions, selections and page tables. A query with no key and
no sink (a padding row at position -1) gets zeros.

The keys are read straight from the arena's strided views (`PagedKeys`: pages [P, per page,
>= D] whose last stride is 1; a page may hold more channels than `D`: V4's indexer key after the
K=V vector, GLM's indexer key and gate score after the latent). Products accumulate in float32;
probabilities are rounded to the key dtype before the value product, as the torch paths do."""

from __future__ import annotations

from typing import NamedTuple

import torch
import triton
import triton.language as tl

from resin_models_cuda.kernels.paged import next_pow2
from resin_models_cuda.kernels.pdl import pdl_args, pdl_enter


class PagedKeys(NamedTuple):
    """Pages `pages` [P, per page, width >= D] (last stride 1) and a page table: row b's pages
    are `ids[indptr[b] : indptr[b + 1]]`, its first held page covering slot index
    `start[b] * per page` (a Window group drops pages that fell out of the window)."""

    pages: torch.Tensor
    indptr: torch.Tensor
    ids: torch.Tensor
    start: torch.Tensor | None = None


@triton.jit
def _tile(acc, m_i, l_i, q, k, valid, scale, PRECISION: tl.constexpr):
    s = tl.dot(q, tl.trans(k), input_precision=PRECISION) * scale  # [BLOCK_H, BLOCK_N]
    s = tl.where(valid[None, :], s, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, 1))
    alpha = tl.exp(m_i - m_new)
    p = tl.exp(s - m_new[:, None])
    l_i = l_i * alpha + tl.sum(p, 1)
    acc = acc * alpha[:, None] + tl.dot(p.to(k.dtype), k, input_precision=PRECISION)
    return acc, m_new, l_i


@triton.jit
def _sparse_kernel(
    q_ptr,  # [T, H, D], strides (q_stride_t, q_stride_h, 1)
    out_ptr,  # [T, H, DV] contiguous (S == 1)
    part_ptr,  # float32 [T, H, S, DV] (S > 1)
    stat_ptr,  # float32 [T, H, S, 2]: max, sum (S > 1)
    sink_ptr,  # float32 [H] (SINK)
    row_ptr,  # int32 [T]
    pos_ptr,  # int32 [T]
    win_ptr,
    win_page_stride,
    win_slot_stride,
    win_indptr,
    win_ids,
    win_start,
    ent_ptr,  # POOL == 0: the entry pages (POOL > 0 reads entries from the window's pages)
    ent_page_stride,
    ent_slot_stride,
    ent_indptr,
    ent_ids,
    count_ptr,  # int32 [B]: entries each row holds (POOL == 0)
    sel_ptr,  # int32 [T, K] (SELECTED)
    q_stride_t,
    q_stride_h,
    H,
    K,
    window,
    ratio,
    page_size,
    per_page,
    scale,
    D: tl.constexpr,
    DV: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_H: tl.constexpr,
    BLOCK_N: tl.constexpr,
    SPLITS: tl.constexpr,
    ENTRIES: tl.constexpr,
    SELECTED: tl.constexpr,
    POOL: tl.constexpr,  # 0: V4's own entry pages; P >= 1: pools of P tokens of the key pages
    SINK: tl.constexpr,
    PRECISION: tl.constexpr,
    PDL: tl.constexpr,
):
    pdl_enter(PDL)
    t = tl.program_id(0).to(tl.int64)
    hb = tl.program_id(1)
    s = tl.program_id(2)
    h = hb * BLOCK_H + tl.arange(0, BLOCK_H)
    d = tl.arange(0, BLOCK_D)
    n = tl.arange(0, BLOCK_N)
    hmask = h < H
    dmask = d < D
    row = tl.load(row_ptr + t).to(tl.int64)
    pos = tl.load(pos_ptr + t)
    q = tl.load(q_ptr + t * q_stride_t + h[:, None] * q_stride_h + d[None, :],
                mask=hmask[:, None] & dmask[None, :], other=0.0)  # fmt: skip
    if SINK:  # split 0 starts from the sink (exp(sink - m) in the sum); the others from nothing
        sink = tl.load(sink_ptr + h, mask=hmask, other=0.0)
        m_i = tl.where(s == 0, sink, -1.0e30)
        l_i = tl.where(s == 0, 1.0, 0.0) + tl.zeros([BLOCK_H], dtype=tl.float32)
    else:
        m_i = tl.zeros([BLOCK_H], dtype=tl.float32) - 1.0e30
        l_i = tl.zeros([BLOCK_H], dtype=tl.float32)
    acc = tl.zeros([BLOCK_H, BLOCK_D], dtype=tl.float32)

    # the window: positions [lo, pos] (POOL > 0: from the query's incomplete pool's start)
    first = tl.load(win_start + row) * page_size
    lo = tl.maximum(tl.maximum(pos - window + 1, 0), first)
    if POOL > 0:
        lo = tl.maximum(lo, pos + 1 - (pos + 1) % POOL)
    share = tl.cdiv(tl.cdiv(pos + 1 - lo, SPLITS), BLOCK_N) * BLOCK_N
    w_lo = lo + s * share
    w_hi = tl.minimum(w_lo + share, pos + 1)
    w_base = tl.load(win_indptr + row)
    for at in range(w_lo, w_hi, BLOCK_N):
        kpos = at + n
        valid = kpos < w_hi
        page = tl.load(win_ids + w_base + (kpos // page_size) - (first // page_size),
                       mask=valid, other=0).to(tl.int64)  # fmt: skip
        slot = page * win_page_stride + (kpos % page_size) * win_slot_stride
        k = tl.load(win_ptr + slot[:, None] + d[None, :],
                    mask=valid[:, None] & dmask[None, :], other=0.0)  # fmt: skip
        acc, m_i, l_i = _tile(acc, m_i, l_i, q, k, valid, scale, PRECISION)

    if ENTRIES:
        if SELECTED:
            if POOL > 0:  # noqa: SIM108 (a constexpr branch)
                total = K * POOL  # a selected pool's tokens, one key each
            else:
                total = K
        else:
            total = tl.minimum(tl.load(count_ptr + row), (pos + 1) // ratio)
        e_share = tl.cdiv(tl.cdiv(total, SPLITS), BLOCK_N) * BLOCK_N
        e_lo = s * e_share
        e_hi = tl.minimum(e_lo + e_share, total)
        e_base = tl.load(ent_indptr + row)
        for at in range(e_lo, e_hi, BLOCK_N):
            j = at + n
            valid = j < e_hi
            if SELECTED:
                if POOL > 0:
                    w = tl.load(sel_ptr + t * K + j // POOL, mask=valid, other=-1)
                else:
                    w = tl.load(sel_ptr + t * K + j, mask=valid, other=-1)
                valid = valid & (w >= 0)
            else:
                w = j
            w = tl.maximum(w, 0)
            if POOL > 0:  # the pool's tokens, from the window's (the key) pages
                kpos = w * POOL + j % POOL
                page = tl.load(win_ids + w_base + (kpos // page_size) - (first // page_size),
                               mask=valid, other=0).to(tl.int64)  # fmt: skip
                slot = page * win_page_stride + (kpos % page_size) * win_slot_stride
                k = tl.load(win_ptr + slot[:, None] + d[None, :],
                            mask=valid[:, None] & dmask[None, :], other=0.0)  # fmt: skip
            else:
                page = tl.load(ent_ids + e_base + w // per_page, mask=valid, other=0).to(tl.int64)
                slot = page * ent_page_stride + (w % per_page) * ent_slot_stride
                k = tl.load(ent_ptr + slot[:, None] + d[None, :],
                            mask=valid[:, None] & dmask[None, :], other=0.0)  # fmt: skip
            acc, m_i, l_i = _tile(acc, m_i, l_i, q, k, valid, scale, PRECISION)

    vmask = hmask[:, None] & (d[None, :] < DV)
    if SPLITS == 1:
        out = (acc / tl.where(l_i > 0, l_i, 1.0)[:, None]).to(out_ptr.dtype.element_ty)
        tl.store(out_ptr + (t * H + h[:, None]) * DV + d[None, :], out, mask=vmask)
    else:
        at = (t * H + h) * SPLITS + s
        tl.store(part_ptr + at[:, None] * DV + d[None, :], acc, mask=vmask)
        tl.store(stat_ptr + at * 2, m_i, mask=hmask)
        tl.store(stat_ptr + at * 2 + 1, l_i, mask=hmask)


@triton.jit
def _merge_kernel(
    part_ptr,  # float32 [T, H, S, D]
    stat_ptr,  # float32 [T, H, S, 2]
    out_ptr,  # [T, H, D]
    D: tl.constexpr,
    BLOCK_D: tl.constexpr,
    SPLITS: tl.constexpr,
    BLOCK_S: tl.constexpr,
    PDL: tl.constexpr,
):
    pdl_enter(PDL)
    th = tl.program_id(0).to(tl.int64)  # t * H + h
    s = tl.arange(0, BLOCK_S)
    d = tl.arange(0, BLOCK_D)
    smask = s < SPLITS
    m = tl.load(stat_ptr + (th * SPLITS + s) * 2, mask=smask, other=-1.0e30)
    l_s = tl.load(stat_ptr + (th * SPLITS + s) * 2 + 1, mask=smask, other=0.0)
    top = tl.max(m, 0)
    w = tl.exp(m - top)
    total = tl.sum(l_s * w, 0)
    part = tl.load(part_ptr + (th * SPLITS + s[:, None]) * D + d[None, :],
                   mask=smask[:, None] & (d[None, :] < D), other=0.0)  # fmt: skip
    out = tl.sum(part * w[:, None], 0) / tl.where(total > 0, total, 1.0)
    tl.store(out_ptr + th * D + d, out.to(out_ptr.dtype.element_ty), mask=d < D)


def default_splits(tokens: int, head_blocks: int, num_sms: int = 132, cap: int = 16) -> int:
    """Splits enough for about two programs an SM (a power of two, at most `cap`)."""
    want = max(1, (2 * num_sms) // max(1, tokens * head_blocks))
    return min(cap, next_pow2(want) if want > 1 else 1)


def sparse_attention(
    q: torch.Tensor,
    sinks: torch.Tensor,
    token_row: torch.Tensor,
    positions: torch.Tensor,
    window_keys: PagedKeys,
    window: int,
    entries: PagedKeys | None = None,
    counts: torch.Tensor | None = None,
    ratio: int = 1,
    selected: torch.Tensor | None = None,
    splits: int = 1,
    block_h: int = 16,
    block_n: int = 32,
    num_warps: int = 4,
) -> torch.Tensor:
    """[T, H, D] in q's dtype: DeepSeek-V4's attention of each query token (module
    docstring). `q` [T, H, D] (rotary applied, unscaled), `sinks` [H] float32,
    `token_row`/`positions` [T] int32, the window's pages and size, and optionally the entry
    pages with `counts` [B] (entries each row holds), `ratio` (tokens an entry) and `selected`
    [T, K] (CSA; None: all visible, HCA)."""
    dim = q.shape[2]
    if entries is not None:
        assert counts is not None and entries.pages.stride(-1) == 1
        assert entries.pages.shape[-1] >= dim
    assert selected is None or entries is not None
    return _launch(
        q, sinks, token_row, positions, window_keys, window, entries, counts, ratio, selected,
        pool=0, scale=dim**-0.5, value_dim=dim, splits=splits, block_h=block_h,
        block_n=block_n, num_warps=num_warps,
    )  # fmt: skip


def pooled_sparse_attention(
    q: torch.Tensor,
    token_row: torch.Tensor,
    positions: torch.Tensor,
    keys: PagedKeys,
    selected: torch.Tensor,
    pool: int,
    scale: float,
    value_dim: int | None = None,
    sinks: torch.Tensor | None = None,
    splits: int = 1,
    block_h: int = 16,
    block_n: int = 32,
    num_warps: int = 4,
) -> torch.Tensor:
    """[T, H, value_dim] in q's dtype: each query token's attention over the `pool`-token pools
    it `selected` [T, K] (pool numbers, -1 none) and its own incomplete pool (module docstring),
    all read from the row's token pages `keys` (History: position p at page `p // per page`).
    `q` [T, H, D] (any token and head strides; D = the key channels: the absorbed MLA's latent
    then rope part), `token_row`/`positions` [T] int32 (a position -1 reads nothing: zeros),
    the values the keys' first `value_dim` channels (default D), `scale` the logits' factor,
    `sinks` [H] float32 optional."""
    assert selected.dim() == 2 and pool >= 1
    return _launch(
        q, sinks, token_row, positions, keys, pool, None, None, 1, selected, pool=pool,
        scale=scale, value_dim=q.shape[2] if value_dim is None else value_dim, splits=splits,
        block_h=block_h, block_n=block_n, num_warps=num_warps,
    )  # fmt: skip


def _launch(
    q: torch.Tensor,
    sinks: torch.Tensor | None,
    token_row: torch.Tensor,
    positions: torch.Tensor,
    window_keys: PagedKeys,
    window: int,
    entries: PagedKeys | None,
    counts: torch.Tensor | None,
    ratio: int,
    selected: torch.Tensor | None,
    *,
    pool: int,
    scale: float,
    value_dim: int,
    splits: int,
    block_h: int,
    block_n: int,
    num_warps: int,
) -> torch.Tensor:
    """The one launch behind both modes: checks the layouts, computes the grid."""
    tokens, heads, dim = q.shape
    assert 0 < value_dim <= dim and token_row.shape == positions.shape == (tokens,)
    if window_keys.start is None:
        raise ValueError("the key pages' table needs its start pages")
    assert window_keys.pages.stride(-1) == 1 and window_keys.pages.shape[-1] >= dim
    if q.stride(2) != 1:
        q = q.contiguous()  # the kernel reads any token / head strides, the channels packed
    out = q.new_empty((tokens, heads, value_dim))
    if not tokens:
        return out
    dev = q.device
    none = torch.zeros(1, dtype=torch.int32, device=dev)
    ent, ent_indptr, ent_ids, ent_strides, per_page = window_keys.pages, none, none, (0, 0), 1
    if entries is not None:
        ent, ent_indptr, ent_ids = entries.pages, entries.indptr, entries.ids
        ent_strides = (entries.pages.stride(0), entries.pages.stride(1))
        per_page = entries.pages.shape[1]
    elif pool:  # pools are read from the key pages (the kernel reads the row's indptr still)
        ent_indptr, ent_ids = window_keys.indptr, window_keys.ids
    k = 0
    if selected is not None:
        assert selected.shape[0] == tokens
        selected = selected.to(torch.int32).contiguous()
        k = selected.shape[1]
    block_h = max(16, min(block_h, next_pow2(heads)))
    head_blocks = triton.cdiv(heads, block_h)
    part = stat = out
    if splits > 1:
        part = torch.empty((tokens, heads, splits, value_dim), dtype=torch.float32, device=dev)
        stat = torch.empty((tokens, heads, splits, 2), dtype=torch.float32, device=dev)
    wp = window_keys.pages
    _sparse_kernel[(tokens, head_blocks, splits)](
        q, out, part, stat, none if sinks is None else sinks.float().contiguous(),
        token_row.int(), positions.int(), wp, wp.stride(0), wp.stride(1),
        window_keys.indptr.int(), window_keys.ids.int(), window_keys.start.int(), ent,
        ent_strides[0], ent_strides[1], ent_indptr.int(), ent_ids.int(),
        none if counts is None else counts.int(), none if selected is None else selected,
        q.stride(0), q.stride(1), heads, k, window, ratio, wp.shape[1], per_page, scale,
        D=dim, DV=value_dim, BLOCK_D=next_pow2(dim), BLOCK_H=block_h, BLOCK_N=block_n,
        SPLITS=splits, ENTRIES=entries is not None or (pool > 0 and k > 0),
        SELECTED=selected is not None, POOL=pool, SINK=sinks is not None,
        PRECISION="ieee" if q.dtype == torch.float32 else "tf32", num_warps=num_warps, **pdl_args(),
    )  # fmt: skip
    if splits > 1:
        _merge_kernel[(tokens * heads,)](part, stat, out, D=value_dim,
                                         BLOCK_D=next_pow2(value_dim), SPLITS=splits,
                                         BLOCK_S=next_pow2(splits), **pdl_args())  # fmt: skip
    return out
