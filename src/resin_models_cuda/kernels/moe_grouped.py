# mypy: disable-error-code="untyped-decorator,no-untyped-def"
"""Fused grouped GEMM for MoE: every (token, expert) pair's row times its expert's matrix, one
launch per projection, over pairs sorted by expert and padded to whole `BLOCK_M` blocks.

`align_pairs` sorts on the device with no host sync: the number of blocks is bounded by
`cdiv(P + E * (BLOCK_M - 1), BLOCK_M)`, known from P alone, so the grid is fixed for a batch
size and a CUDA graph replays it whatever the routing; blocks past the used ones read expert
-1 and return at once (they load nothing). Each used block reads its expert's weight tiles
once for up to `BLOCK_M` pairs, so a step reads every routed expert about once.

`out[p, n] = scale[p] * (sum_k x[p // ROW_DIV, k] * w[e_p, n, k] + bias[e_p, n])`
(`ROW_DIV` = top-k when x holds one row per token, 1 when it holds one row per pair).
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import triton
import triton.language as tl


class AlignedPairs(NamedTuple):
    """Pairs sorted by expert: `sorted_pairs` [NB * BLOCK_M] (pair id, or P for padding) and
    `block_expert` [NB] (expert of each block, -1 past the used blocks)."""

    sorted_pairs: torch.Tensor
    block_expert: torch.Tensor
    block_m: int


@triton.jit
def _align_kernel(
    experts_ptr,  # int [P]
    cursor_ptr,  # int32 [E] scratch: next free row of each expert
    sorted_pairs_ptr,  # int32 [NB * BLOCK_M]
    block_expert_ptr,  # int32 [NB]
    P,
    NB,
    E: tl.constexpr,
    BINS: tl.constexpr,  # power of two > E (bin E collects the padding lanes)
    P_PAD: tl.constexpr,
    BLOCK_M: tl.constexpr,
    CHUNK: tl.constexpr,
):
    """One program: histogram, padded offsets, block -> expert, and every pair's row.

    A pair's row within its expert's run comes from an atomic cursor, so the order inside a
    run is arbitrary; each pair's output row depends only on its own inputs, so results do
    not depend on it."""
    p = tl.arange(0, P_PAD)
    ids = tl.load(experts_ptr + p, mask=p < P, other=E).to(tl.int32)
    counts = tl.histogram(ids, BINS)
    bins = tl.arange(0, BINS)
    counts = tl.where(bins < E, counts, 0)
    padded = (counts + BLOCK_M - 1) // BLOCK_M * BLOCK_M
    ends = tl.cumsum(padded, 0)
    tl.store(cursor_ptr + bins, ends - padded, mask=bins < E)
    for b0 in range(0, NB, CHUNK):
        b = b0 + tl.arange(0, CHUNK)
        expert = tl.sum((ends[None, :] <= (b * BLOCK_M)[:, None]).to(tl.int32), 1)
        tl.store(block_expert_ptr + b, tl.where(expert < E, expert, -1), mask=b < NB)
    for r0 in range(0, NB * BLOCK_M, CHUNK):
        r = r0 + tl.arange(0, CHUNK)
        tl.store(sorted_pairs_ptr + r, tl.full([CHUNK], 0, tl.int32) + P, mask=r < NB * BLOCK_M)
    tl.debug_barrier()
    dest = tl.atomic_add(cursor_ptr + ids, 1, mask=p < P)
    tl.store(sorted_pairs_ptr + dest, p, mask=p < P)


FUSED_ALIGN_MAX_PAIRS = 4096


def align_pairs(experts: torch.Tensor, num_experts: int, block_m: int) -> AlignedPairs:
    """`experts` [P] (int) -> pairs grouped by expert, each group padded to `block_m` rows.

    Up to `FUSED_ALIGN_MAX_PAIRS` pairs (decode) in one Triton program; more with a few
    PyTorch ops (prefill; stable order)."""
    pairs = experts.numel()
    if 0 < pairs <= FUSED_ALIGN_MAX_PAIRS:
        return _align_fused(experts.reshape(-1), num_experts, block_m)
    return _align_torch(experts, num_experts, block_m)


def _align_fused(experts: torch.Tensor, num_experts: int, block_m: int) -> AlignedPairs:
    pairs, device = experts.numel(), experts.device
    blocks = triton.cdiv(pairs + num_experts * (block_m - 1), block_m)
    sorted_pairs = torch.empty(blocks * block_m, dtype=torch.int32, device=device)
    block_expert = torch.empty(blocks, dtype=torch.int32, device=device)
    cursor = torch.empty(num_experts, dtype=torch.int32, device=device)
    _align_kernel[(1,)](
        experts, cursor, sorted_pairs, block_expert, pairs, blocks,
        E=num_experts, BINS=triton.next_power_of_2(num_experts + 1),
        P_PAD=triton.next_power_of_2(pairs), BLOCK_M=block_m, CHUNK=256, num_warps=4,
    )  # fmt: skip
    return AlignedPairs(sorted_pairs, block_expert, block_m)


def _align_torch(experts: torch.Tensor, num_experts: int, block_m: int) -> AlignedPairs:
    pairs = experts.numel()
    device = experts.device
    blocks = triton.cdiv(pairs + num_experts * (block_m - 1), block_m)
    ids = experts.reshape(-1).to(torch.int64)
    counts = torch.zeros(num_experts, dtype=torch.int64, device=device)
    counts.scatter_add_(0, ids, torch.ones_like(ids))
    padded = (counts + block_m - 1) // block_m * block_m
    ends = torch.cumsum(padded, 0)
    order = torch.argsort(ids, stable=True)
    sorted_ids = ids[order]
    first = torch.cumsum(counts, 0) - counts  # first sorted index of each expert
    rank = torch.arange(pairs, device=device) - first[sorted_ids]
    dest = ends[sorted_ids] - padded[sorted_ids] + rank
    sorted_pairs = torch.full((blocks * block_m,), pairs, dtype=torch.int32, device=device)
    sorted_pairs[dest] = order.to(torch.int32)
    starts = torch.arange(blocks, device=device) * block_m
    block_expert = torch.searchsorted(ends, starts, right=True)
    block_expert = torch.where(block_expert < num_experts, block_expert, -1).to(torch.int32)
    return AlignedPairs(sorted_pairs, block_expert, block_m)


@triton.jit
def pair_block(
    sorted_pairs_ptr,
    num_pairs,
    N,
    ROW_DIV: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    """A grouped GEMM program's tile: its pairs (`valid`: the real ones), their input rows
    (`pair // ROW_DIV`), its output columns `n` (`nmask`: inside `N`)."""
    pairs = tl.load(sorted_pairs_ptr + tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M))
    valid = pairs < num_pairs
    rows = (pairs // ROW_DIV).to(tl.int64)
    n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    return pairs, valid, rows, n, n < N


@triton.jit
def store_pairs(
    acc,
    e,
    pairs,
    valid,
    n,
    nmask,
    bias_ptr,
    scale_ptr,
    out_ptr,
    N,
    stride_o,
    HAS_BIAS: tl.constexpr,
    HAS_SCALE: tl.constexpr,
):
    """A grouped GEMM's epilogue: `+ bias[e]`, `* scale[pair]`, stored at each pair's row."""
    if HAS_BIAS:
        acc += tl.load(bias_ptr + e.to(tl.int64) * N + n, mask=nmask, other=0.0).to(tl.float32)[
            None, :
        ]
    if HAS_SCALE:
        acc *= tl.load(scale_ptr + pairs, mask=valid, other=0.0)[:, None]
    out = out_ptr + pairs.to(tl.int64)[:, None] * stride_o + n[None, :]
    tl.store(out, acc.to(out_ptr.dtype.element_ty), mask=valid[:, None] & nmask[None, :])


@triton.jit
def _grouped_gemm_kernel(
    x_ptr,  # [R, K], row stride stride_x, last dim contiguous
    w_ptr,  # [E, N, K] contiguous
    bias_ptr,  # [E, N] (read when HAS_BIAS)
    scale_ptr,  # fp32 [P] (read when HAS_SCALE)
    out_ptr,  # [P, N], row stride stride_o
    sorted_pairs_ptr,  # int32 [NB * BLOCK_M]
    block_expert_ptr,  # int32 [NB]
    num_pairs,
    N,
    K,
    stride_x,
    stride_o,
    ROW_DIV: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    HAS_SCALE: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
):
    e = tl.load(block_expert_ptr + tl.program_id(0))
    if e < 0:
        return
    pairs, valid, rows, n, nmask = pair_block(sorted_pairs_ptr, num_pairs, N, ROW_DIV, BLOCK_M,
                                              BLOCK_N)  # fmt: skip
    w_base = w_ptr + e.to(tl.int64) * N * K
    acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    for k0 in range(0, K, BLOCK_K):
        k = k0 + tl.arange(0, BLOCK_K)
        kmask = k < K
        a = tl.load(
            x_ptr + rows[:, None] * stride_x + k[None, :],
            mask=valid[:, None] & kmask[None, :],
            other=0.0,
        )
        b = tl.load(
            w_base + n[None, :].to(tl.int64) * K + k[:, None],
            mask=nmask[None, :] & kmask[:, None],
            other=0.0,
        )
        acc += tl.dot(a, b, input_precision=DOT_PRECISION)
    store_pairs(acc, e, pairs, valid, n, nmask, bias_ptr, scale_ptr, out_ptr, N, stride_o,
                HAS_BIAS, HAS_SCALE)  # fmt: skip


def grouped_gemm(
    x: torch.Tensor,
    w: torch.Tensor,
    aligned: AlignedPairs,
    *,
    num_pairs: int,
    row_div: int,
    out: torch.Tensor,
    bias: torch.Tensor | None = None,
    scale: torch.Tensor | None = None,
    block_n: int = 64,
    block_k: int = 64,
    num_warps: int = 4,
    num_stages: int = 3,
) -> torch.Tensor:
    """`out[p] = scale[p] * (W[e_p] @ x[p // row_div] + bias[e_p])` for every pair p."""
    assert x.dim() == 2 and x.stride(1) == 1 and w.dim() == 3 and w.is_contiguous()
    _, n, k = w.shape
    assert x.shape[1] == k and out.shape == (num_pairs, n) and out.stride(1) == 1
    if bias is not None:
        assert bias.shape == (w.shape[0], n) and bias.is_contiguous()
    if scale is not None:
        assert scale.dtype == torch.float32 and scale.numel() == num_pairs
    blocks = aligned.block_expert.shape[0]
    if num_pairs == 0:
        return out
    _grouped_gemm_kernel[(blocks, triton.cdiv(n, block_n))](
        x,
        w,
        w if bias is None else bias,
        out if scale is None else scale,
        out,
        aligned.sorted_pairs,
        aligned.block_expert,
        num_pairs,
        n,
        k,
        x.stride(0),
        out.stride(0),
        ROW_DIV=row_div,
        HAS_BIAS=bias is not None,
        HAS_SCALE=scale is not None,
        BLOCK_M=aligned.block_m,
        BLOCK_N=block_n,
        BLOCK_K=block_k,
        DOT_PRECISION="ieee" if x.dtype == torch.float32 else "tf32",
        num_warps=num_warps,
        num_stages=num_stages,
    )
    return out
