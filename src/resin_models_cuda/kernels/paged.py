"""The paged KV-cache view the attention kernels read (one layer's K or V).

A layer's cache is a strided view `[num_pages, page_size, num_kv_heads, head_dim]` of the
runner's arena (the last dimension contiguous). Token position `p` of a plan row lives at
`page_ids[page_indptr[row] + p // page_size - page_start[row]]`, offset `p % page_size`.
"""

from __future__ import annotations

import torch


def check_cache(cache: torch.Tensor, name: str) -> None:
    """Assert the layout every kernel relies on: 4-D, head_dim contiguous."""
    assert cache.dim() == 4, f"{name} must be [pages, page_size, kv_heads, head_dim]"
    assert cache.stride(3) == 1, f"{name}: head_dim must be contiguous"
    page_size = cache.shape[1]
    assert page_size & (page_size - 1) == 0, f"{name}: page_size must be a power of two"


def next_pow2(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())
