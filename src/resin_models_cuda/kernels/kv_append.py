# mypy: disable-error-code="untyped-decorator,no-untyped-def"
"""KV append: write each new token's K and V into its exact arena slot.

`slots[t] = page * page_size + offset` (the plan's `append_slots`); a negative slot (CUDA-graph
padding rows) writes nothing. The kernel's Triton `launch_metadata` (`append_bytes`) counts
the tokens it writes, not the arena it is handed (`resin bench runner --kernels`, proton).
"""

from __future__ import annotations

from typing import Any

import torch
import triton
import triton.language as tl

from resin_models_cuda.kernels.paged import check_cache, next_pow2
from resin_models_cuda.kernels.pdl import pdl_args, pdl_enter


def append_bytes(grid: Any, metadata: Any, args: dict[str, Any]) -> dict[str, int]:
    """Triton's `launch_metadata` hook, `(grid, metadata, {argument: value}) -> {"bytes": n}`:
    the T tokens' K and V read, their slots, and as many K and V written into the caches."""
    k, cache = args["k_ptr"], args["k_cache_ptr"]
    tokens = k.shape[0]
    read = 2 * k.numel() * k.element_size() + tokens * args["slots_ptr"].element_size()
    return {"bytes": read + 2 * k.numel() * cache.element_size()}


@triton.jit(launch_metadata=append_bytes)
def _kv_append_kernel(
    k_ptr,  # [T, Hkv, D], strides (stride_kt, stride_kh, 1)
    v_ptr,  # [T, Hkv, D], strides (stride_vt, stride_vh, 1)
    k_cache_ptr,  # [pages, PAGE, Hkv, D], strides (stride_cp, stride_ct, stride_ch, 1)
    v_cache_ptr,  # same layout and strides as k_cache
    slots_ptr,  # int32 or int64 [T]
    stride_kt,
    stride_kh,
    stride_vt,
    stride_vh,
    stride_cp,
    stride_ct,
    stride_ch,
    NUM_HEADS: tl.constexpr,
    HEADS_PAD: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    PAGE: tl.constexpr,
    PDL: tl.constexpr,
):
    pdl_enter(PDL)
    t = tl.program_id(0)
    slot = tl.load(slots_ptr + t).to(tl.int64)
    if slot >= 0:
        h = tl.arange(0, HEADS_PAD)
        d = tl.arange(0, HEAD_DIM)
        mask = (h < NUM_HEADS)[:, None]
        dst = (slot // PAGE) * stride_cp + (slot % PAGE) * stride_ct + h[:, None] * stride_ch
        k = tl.load(k_ptr + t * stride_kt + h[:, None] * stride_kh + d[None, :], mask=mask)
        tl.store(k_cache_ptr + dst + d[None, :], k.to(k_cache_ptr.dtype.element_ty), mask=mask)
        v = tl.load(v_ptr + t * stride_vt + h[:, None] * stride_vh + d[None, :], mask=mask)
        tl.store(v_cache_ptr + dst + d[None, :], v.to(v_cache_ptr.dtype.element_ty), mask=mask)


def kv_append(
    k: torch.Tensor,
    v: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slots: torch.Tensor,
) -> None:
    """Store `k`, `v` [T, Hkv, D] at `slots` [T] of the paged caches (in place)."""
    check_cache(k_cache, "k_cache")
    assert k_cache.shape == v_cache.shape and k_cache.stride() == v_cache.stride()
    num_tokens, num_heads, head_dim = k.shape
    assert v.shape == k.shape and k.stride(2) == 1 and v.stride(2) == 1
    assert (num_heads, head_dim) == tuple(k_cache.shape[2:])
    assert head_dim == next_pow2(head_dim), "head_dim must be a power of two"
    assert slots.dtype in (torch.int32, torch.int64) and slots.shape[0] >= num_tokens
    if num_tokens == 0:
        return
    _kv_append_kernel[(num_tokens,)](
        k, v, k_cache, v_cache, slots,
        k.stride(0), k.stride(1), v.stride(0), v.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        NUM_HEADS=num_heads, HEADS_PAD=next_pow2(num_heads), HEAD_DIM=head_dim,
        PAGE=k_cache.shape[1], num_warps=4, **pdl_args(),
    )  # fmt: skip
