# mypy: disable-error-code="untyped-decorator,no-untyped-def"
"""DeepSeek-V4's sparse attention: one shared K=V head (MQA, `D` wide, 512 in V4) read by every
query head, over two key sets per query token at position p:

* the sliding window: positions (p - window, p] of the row's Window-group pages;
* compressed entries of the row's Compressed-group pages: either the entries a CSA indexer
  selected (`selected` [T, K]: entry numbers, -1 for none) or, for HCA, every entry the query
  may see (`w < min(count, (p + 1) // ratio)`).

The softmax carries a per-head sink logit in its denominator (probability mass with no value).
Every token is one query row with its own position, so one launch serves decode and varlen
prefill alike. Grid `(T, head blocks, S)`: program s takes the s-th share of the window's keys
and of the entries' (flash-decoding), so a batch of few tokens still fills the GPU; each key
tile is loaded once for a block of heads and multiplied with `tl.dot`. With S > 1 a second
kernel merges the partial (max, sum, accumulator) triples; the sink joins split 0's state from
the start, so the merge needs no special case. The grid depends on T, the heads and S only, so
a CUDA graph replays it for any positions and page tables.

The keys are read straight from the arena's strided views (`PagedKeys`: pages [P, per page,
>= D] whose last stride is 1; an entry page may hold more channels than `D`, the indexer key
after the K=V vector). Products accumulate in float32; probabilities are rounded to the key
dtype before the value product, as the torch path does."""

from __future__ import annotations

from typing import NamedTuple

import torch
import triton
import triton.language as tl

from resin_models_cuda.kernels.paged import next_pow2


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
    q_ptr,  # [T, H, D] contiguous
    out_ptr,  # [T, H, D] (S == 1)
    part_ptr,  # float32 [T, H, S, D] (S > 1)
    stat_ptr,  # float32 [T, H, S, 2]: max, sum (S > 1)
    sink_ptr,  # float32 [H]
    row_ptr,  # int32 [T]
    pos_ptr,  # int32 [T]
    win_ptr,
    win_page_stride,
    win_slot_stride,
    win_indptr,
    win_ids,
    win_start,
    ent_ptr,
    ent_page_stride,
    ent_slot_stride,
    ent_indptr,
    ent_ids,
    count_ptr,  # int32 [B]: entries each row holds
    sel_ptr,  # int32 [T, K] (SELECTED)
    H,
    K,
    window,
    ratio,
    page_size,
    per_page,
    scale,
    D: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_H: tl.constexpr,
    BLOCK_N: tl.constexpr,
    SPLITS: tl.constexpr,
    ENTRIES: tl.constexpr,
    SELECTED: tl.constexpr,
    PRECISION: tl.constexpr,
):
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
    q = tl.load(q_ptr + (t * H + h[:, None]) * D + d[None, :],
                mask=hmask[:, None] & dmask[None, :], other=0.0)  # fmt: skip
    sink = tl.load(sink_ptr + h, mask=hmask, other=0.0)
    # split 0 starts from the sink (exp(sink - m) in the sum); the others from nothing
    m_i = tl.where(s == 0, sink, -1.0e30)
    l_i = tl.where(s == 0, 1.0, 0.0) + tl.zeros([BLOCK_H], dtype=tl.float32)
    acc = tl.zeros([BLOCK_H, BLOCK_D], dtype=tl.float32)

    # the window: positions [lo, pos]
    first = tl.load(win_start + row) * page_size
    lo = tl.maximum(tl.maximum(pos - window + 1, 0), first)
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
        if SELECTED:  # noqa: SIM108 (a constexpr branch)
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
                w = tl.load(sel_ptr + t * K + j, mask=valid, other=-1)
                valid = valid & (w >= 0)
            else:
                w = j
            w = tl.maximum(w, 0)
            page = tl.load(ent_ids + e_base + w // per_page, mask=valid, other=0).to(tl.int64)
            slot = page * ent_page_stride + (w % per_page) * ent_slot_stride
            k = tl.load(ent_ptr + slot[:, None] + d[None, :],
                        mask=valid[:, None] & dmask[None, :], other=0.0)  # fmt: skip
            acc, m_i, l_i = _tile(acc, m_i, l_i, q, k, valid, scale, PRECISION)

    if SPLITS == 1:
        out = (acc / l_i[:, None]).to(out_ptr.dtype.element_ty)
        tl.store(out_ptr + (t * H + h[:, None]) * D + d[None, :], out,
                 mask=hmask[:, None] & dmask[None, :])  # fmt: skip
    else:
        at = (t * H + h) * SPLITS + s
        tl.store(part_ptr + at[:, None] * D + d[None, :], acc,
                 mask=hmask[:, None] & dmask[None, :])  # fmt: skip
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
):
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
    out = tl.sum(part * w[:, None], 0) / total
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
    """[T, H, D] in q's dtype: each query token's attention (module docstring). `q` [T, H, D]
    (rotary applied, unscaled), `sinks` [H] float32, `token_row`/`positions` [T] int32, the
    window's pages and size, and optionally the entry pages with `counts` [B] (entries each row
    holds), `ratio` (tokens an entry) and `selected` [T, K] (CSA; None: all visible, HCA)."""
    tokens, heads, dim = q.shape
    if window_keys.start is None:
        raise ValueError("the window's page table needs its start pages")
    assert window_keys.pages.stride(-1) == 1 and window_keys.pages.shape[-1] >= dim
    out = torch.empty_like(q)
    if not tokens:
        return out
    dev = q.device
    none = torch.zeros(1, dtype=torch.int32, device=dev)
    ent, ent_indptr, ent_ids, ent_strides, per_page = window_keys.pages, none, none, (0, 0), 1
    if entries is not None:
        assert counts is not None and entries.pages.stride(-1) == 1
        assert entries.pages.shape[-1] >= dim
        ent, ent_indptr, ent_ids = entries.pages, entries.indptr, entries.ids
        ent_strides = (entries.pages.stride(0), entries.pages.stride(1))
        per_page = entries.pages.shape[1]
    k = 0
    if selected is not None:
        assert entries is not None and selected.shape[0] == tokens
        selected = selected.to(torch.int32).contiguous()
        k = selected.shape[1]
    block_h = max(16, min(block_h, next_pow2(heads)))
    head_blocks = triton.cdiv(heads, block_h)
    part = stat = out
    if splits > 1:
        part = torch.empty((tokens, heads, splits, dim), dtype=torch.float32, device=dev)
        stat = torch.empty((tokens, heads, splits, 2), dtype=torch.float32, device=dev)
    wp = window_keys.pages
    _sparse_kernel[(tokens, head_blocks, splits)](
        q.contiguous(), out, part, stat, sinks.float().contiguous(), token_row.int(),
        positions.int(), wp, wp.stride(0), wp.stride(1), window_keys.indptr.int(),
        window_keys.ids.int(), window_keys.start.int(), ent, ent_strides[0], ent_strides[1],
        ent_indptr.int(), ent_ids.int(), none if counts is None else counts.int(),
        none if selected is None else selected, heads, k, window, ratio, wp.shape[1],
        per_page, dim**-0.5,
        D=dim, BLOCK_D=next_pow2(dim), BLOCK_H=block_h, BLOCK_N=block_n, SPLITS=splits,
        ENTRIES=entries is not None, SELECTED=selected is not None,
        PRECISION="ieee" if q.dtype == torch.float32 else "tf32", num_warps=num_warps,
    )  # fmt: skip
    if splits > 1:
        _merge_kernel[(tokens * heads,)](part, stat, out, D=dim, BLOCK_D=next_pow2(dim),
                                         SPLITS=splits, BLOCK_S=next_pow2(splits))  # fmt: skip
    return out
