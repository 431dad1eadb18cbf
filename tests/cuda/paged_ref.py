"""Plain-PyTorch references for the paged kernels, and random paged caches to test them on."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from resin_models_cuda.kernels.paged import PagedKV


@dataclass(frozen=True)
class PagedCase:
    """Random contexts scattered over shuffled pages; `dense_k[b]` is row b's [L, Hkv, D]."""

    k_cache: torch.Tensor
    v_cache: torch.Tensor
    page_indptr: torch.Tensor
    page_ids: torch.Tensor
    page_start: torch.Tensor
    lens: list[int]
    dense_k: list[torch.Tensor]
    dense_v: list[torch.Tensor]

    @property
    def kv(self) -> PagedKV:
        return PagedKV(self.k_cache, self.v_cache, self.page_indptr, self.page_ids, self.page_start)


def make_paged(
    lens: list[int],
    kv_heads: int,
    head_dim: int,
    page: int,
    dtype: torch.dtype,
    device: str,
    seed: int = 0,
    layers: int = 2,
    first_page: list[int] | None = None,
) -> PagedCase:
    """Pages of every row come from a shuffled arena; the cache is a strided view of a
    [pages, layers, 2, page, Hkv, D] arena (layer 1), like the runner's."""
    gen = torch.Generator().manual_seed(seed)
    first_page = first_page or [0] * len(lens)
    counts = [(n + page - 1) // page - f for n, f in zip(lens, first_page, strict=True)]
    total = sum(counts) + 3
    arena = torch.randn((total, layers, 2, page, kv_heads, head_dim), generator=gen).to(dtype)
    arena = arena.to(device)
    perm = np.random.default_rng(seed).permutation(total)[: sum(counts)]
    k_cache, v_cache = arena[:, 1, 0], arena[:, 1, 1]
    indptr = np.concatenate([[0], np.cumsum(counts)]).astype(np.int32)
    dense_k, dense_v = [], []
    for b, n in enumerate(lens):
        pages = perm[indptr[b] : indptr[b + 1]]
        full_k = torch.zeros((first_page[b] * page, kv_heads, head_dim), dtype=dtype, device=device)
        ks = [full_k] + [k_cache[p] for p in pages]
        vs = [full_k.clone()] + [v_cache[p] for p in pages]
        dense_k.append(torch.cat(ks)[:n])
        dense_v.append(torch.cat(vs)[:n])
    return PagedCase(
        k_cache,
        v_cache,
        torch.tensor(indptr, device=device),
        torch.tensor(perm.astype(np.int32), device=device),
        torch.tensor(first_page, dtype=torch.int32, device=device),
        lens,
        dense_k,
        dense_v,
    )


def ref_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    q_pos: torch.Tensor,
    scale: float,
    window: int,
) -> torch.Tensor:
    """q [M, Hq, D] at positions q_pos; k, v [L, Hkv, D] at positions 0..L-1; float32 math."""
    group = q.shape[1] // k.shape[1]
    kf = k.float().repeat_interleave(group, dim=1)
    vf = v.float().repeat_interleave(group, dim=1)
    scores = torch.einsum("mhd,nhd->hmn", q.float(), kf) * scale
    kv_pos = torch.arange(k.shape[0], device=q.device)
    keep = kv_pos[None, :] <= q_pos[:, None]
    if window > 0:
        keep &= kv_pos[None, :] > q_pos[:, None] - window
    scores = scores.masked_fill(~keep[None], float("-inf"))
    return torch.einsum("hmn,nhd->mhd", torch.softmax(scores, dim=-1), vf)
