# mypy: disable-error-code="untyped-decorator,no-untyped-def"
"""The paged KV-cache view the attention kernels read, and the one KV sweep they share.

A layer's cache is a strided view `[num_pages, page_size, num_kv_heads, head_dim]` of the
runner's arena (the last dimension contiguous). Token position `p` of a plan row lives at
`page_ids[page_indptr[row] + p // page_size - page_start[row]]`, offset `p % page_size`.

`PagedKV` bundles one layer's K and V with that page table; a launcher checks it once
(`PagedKV.check`) and hands it to its kernel whole, with `PagedKV.strides` beside it (Triton
passes a NamedTuple's tensors as pointers, and specializes its integers like lone ones).
`paged_attend` is the online softmax over those pages that decode and prefill both run.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import triton
import triton.language as tl


def check_cache(cache: torch.Tensor, name: str) -> None:
    """Assert the layout every kernel relies on: 4-D, head_dim contiguous."""
    assert cache.dim() == 4, f"{name} must be [pages, page_size, kv_heads, head_dim]"
    assert cache.stride(3) == 1, f"{name}: head_dim must be contiguous"
    page_size = cache.shape[1]
    assert page_size & (page_size - 1) == 0, f"{name}: page_size must be a power of two"


def next_pow2(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


class PagedKV(NamedTuple):
    """One layer's K and V pages and a plan's page table over them (module doc)."""

    k_cache: torch.Tensor  # [pages, page_size, Hkv, D]
    v_cache: torch.Tensor  # same shape and strides as k_cache
    page_indptr: torch.Tensor  # int32 [B+1]: row b's pages in page_ids[indptr[b]:indptr[b+1]]
    page_ids: torch.Tensor  # int32 [P]
    page_start: torch.Tensor  # int32 [B]: row b's first page held (earlier ones left a window)

    @property
    def strides(self) -> tuple[int, int, int]:
        """Element strides of a page, a token and a KV head (V's equal K's)."""
        k = self.k_cache
        return k.stride(0), k.stride(1), k.stride(2)

    @property
    def num_kv_heads(self) -> int:
        return self.k_cache.shape[2]

    @property
    def page_size(self) -> int:
        return self.k_cache.shape[1]

    def check(self, q: torch.Tensor, rows: int) -> None:
        """Assert what the kernels assume, for queries `q` [T, Hq, D] over `rows` plan rows."""
        check_cache(self.k_cache, "k_cache")
        k, v = self.k_cache, self.v_cache
        assert k.shape == v.shape and k.stride() == v.stride(), "K and V share one layout"
        head_dim = k.shape[3]
        assert q.dim() == 3 and q.stride(2) == 1 and q.shape[2] == head_dim
        assert q.shape[1] % self.num_kv_heads == 0, "query heads are groups of KV heads"
        assert head_dim == next_pow2(head_dim), "head_dim must be a power of two"
        for t in (self.page_indptr, self.page_ids, self.page_start):
            assert t.dtype == torch.int32, "page tables are int32"
        assert self.page_indptr.shape[0] >= rows + 1 and self.page_start.shape[0] >= rows


@triton.jit
def paged_attend(
    q,  # [M, D] query tile: M (query, head) pairs that share KV head `kvh`
    kv,  # PagedKV
    kv_strides,  # PagedKV.strides
    row,  # the plan row whose pages are read
    kvh,
    lo,  # sequence positions [lo, hi) are walked, BLOCK_N at a time from lo
    hi,
    key_lo,  # [M]: tile row i sees keys key_lo[i] <= p < key_hi[i]
    key_hi,
    qk_scale,  # softmax scale * log2(e)
    HEAD_DIM: tl.constexpr,
    PAGE: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    """Online softmax of `q` over the row's paged K/V; returns `(acc, m, l)`: the unnormalized
    output [M, D] fp32, the running max in log2 units (-inf for a tile row that saw no key)
    and the softmax denominator [M] (0 then). Float32 inputs multiply in full precision (no
    TF32 rounding: they are the reference the tests compare with)."""
    PRECISION: tl.constexpr = "ieee" if q.dtype == tl.float32 else "tf32"
    row_base = tl.load(kv.page_indptr + row)
    page_start = tl.load(kv.page_start + row)
    d = tl.arange(0, HEAD_DIM)
    m_i = tl.full(key_lo.shape, float("-inf"), tl.float32)
    l_i = tl.zeros(key_lo.shape, tl.float32)
    acc = tl.zeros([key_lo.shape[0], HEAD_DIM], tl.float32)
    for start in range(lo, hi, BLOCK_N):
        offs = start + tl.arange(0, BLOCK_N)
        nmask = offs < hi
        page = tl.load(kv.page_ids + row_base + offs // PAGE - page_start, mask=nmask, other=0)
        tok = page.to(tl.int64) * kv_strides[0] + (offs % PAGE) * kv_strides[1]
        tok += kvh * kv_strides[2]
        k = tl.load(kv.k_cache + tok[:, None] + d[None, :], mask=nmask[:, None], other=0.0)
        qk = tl.dot(q, tl.trans(k), input_precision=PRECISION).to(tl.float32) * qk_scale
        keep = nmask[None, :] & (offs[None, :] >= key_lo[:, None])
        qk = tl.where(keep & (offs[None, :] < key_hi[:, None]), qk, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(qk, 1))
        # A row whose whole tile is masked keeps m = -inf; shift by 0 then to avoid inf - inf.
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        alpha = tl.exp2(m_i - m_safe)
        p = tl.exp2(qk - m_safe[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        v = tl.load(kv.v_cache + tok[:, None] + d[None, :], mask=nmask[:, None], other=0.0)
        pv = tl.dot(p.to(v.dtype), v, input_precision=PRECISION)
        acc = acc * alpha[:, None] + pv.to(tl.float32)
        m_i = m_new
    return acc, m_i, l_i
