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

One kernel for every weight format (`W_FMT`, compile time, as the expert GEMV's: dense, FP8
with its block or channel scales, MXFP4 decoded in registers or through `tl.dot_scaled`;
`GemvWeights`): the K tile's load and dot (`_tile_dot`) is the only part that differs, so the
pair-block prologue and the bias / routing-weight / store epilogue exist once; `moe_fp8` and
`moe_mxfp4` keep only their layout checks and format choice. Its `launch_metadata`
(`moe_gemv.routed_bytes`) counts the routed experts' bytes only.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import triton
import triton.language as tl

from resin_models_cuda.kernels.moe_gemv import GemvWeights, routed_bytes
from resin_models_cuda.kernels.pdl import pdl_args, pdl_enter
from resin_models_cuda.kernels.quant_tiles import (
    DENSE,
    FP8,
    MXFP4,
    MXFP4_DOT,
    expert_matrix,
    fp8_tile_dot,
    mxfp4_packed_tile,
    mxfp4_tile,
)


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
    PDL: tl.constexpr,
):
    """One program: histogram, padded offsets, block -> expert, and every pair's row.

    A pair's row within its expert's run comes from an atomic cursor, so the order inside a
    run is arbitrary; each pair's output row depends only on its own inputs, so results do
    not depend on it."""
    pdl_enter(PDL)
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
        P_PAD=triton.next_power_of_2(pairs), BLOCK_M=block_m, CHUNK=256, num_warps=4, **pdl_args(),
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
def _tile_dot(acc, x_rows, valid, w_e, s_e, n, nmask, k0, K, W_FMT: tl.constexpr,
              DOT_FMT: tl.constexpr, QN: tl.constexpr, QK: tl.constexpr,
              QUANTIZE_X: tl.constexpr, FAST: tl.constexpr, BLOCK_N: tl.constexpr,
              BLOCK_K: tl.constexpr, DOT_PRECISION: tl.constexpr):  # fmt: skip
    """`acc` plus the pairs' rows times expert columns `n` over the K tile at `k0`: the only
    part of the grouped GEMM that depends on how the weights are stored (`w_e`, `s_e`: the
    expert's values and scales, `quant_tiles.expert_matrix`)."""
    if W_FMT == 2:  # MXFP4 dequantized in registers: even and odd columns as two dots
        byte = k0 // 2 + tl.arange(0, BLOCK_K // 2)
        amask = valid[:, None] & (byte < K // 2)[None, :]
        a_even = tl.load(x_rows + 2 * byte[None, :], mask=amask, other=0.0)
        a_odd = tl.load(x_rows + 2 * byte[None, :] + 1, mask=amask, other=0.0)
        low = mxfp4_tile(w_e, s_e, n, nmask, k0 // 32, K, BLOCK_N, BLOCK_K // 32, False)
        acc += tl.dot(a_even, low.to(a_even.dtype), input_precision=DOT_PRECISION)
        high = mxfp4_tile(w_e, s_e, n, nmask, k0 // 32, K, BLOCK_N, BLOCK_K // 32, True)
        acc += tl.dot(a_odd, high.to(a_odd.dtype), input_precision=DOT_PRECISION)
    else:
        k = k0 + tl.arange(0, BLOCK_K)
        kmask = k < K
        a = tl.load(x_rows + k[None, :], mask=valid[:, None] & kmask[None, :], other=0.0)
        if W_FMT == 3:  # MXFP4: the packed tile and its scales straight to tl.dot_scaled
            w, scale = mxfp4_packed_tile(w_e, s_e, n, nmask, k0 // 32, K, BLOCK_K // 32)
            acc = tl.dot_scaled(a, None, DOT_FMT, w, scale, "e2m1", acc, fast_math=FAST)
        else:
            b = tl.load(w_e + n[None, :].to(tl.int64) * K + k[:, None],
                        mask=nmask[None, :] & kmask[:, None], other=0.0)  # fmt: skip
            if W_FMT == 0:
                acc += tl.dot(a, b, input_precision=DOT_PRECISION)
            else:  # FP8: the tile's partial sums times their scale block's
                part = fp8_tile_dot(a, b, QUANTIZE_X, DOT_PRECISION)
                scale_row = s_e + (n // QN) * tl.cdiv(K, QK)
                acc += part * tl.load(scale_row + k0 // QK, mask=nmask, other=0.0)[None, :]
    return acc


@triton.jit(launch_metadata=routed_bytes("block_expert_ptr"))
def _grouped_kernel(
    x_ptr,  # [R, K], row stride stride_x, last dim contiguous
    w_ptr,  # [E, N, K] in format W_FMT (MXFP4: bytes [E, N, K / 2])
    s_ptr,  # its scales (W_FMT != DENSE)
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
    W_FMT: tl.constexpr,  # DENSE, FP8, MXFP4 (registers) or MXFP4_DOT (`tl.dot_scaled`)
    DOT_FMT: tl.constexpr,  # MXFP4_DOT: x's dtype as `tl.dot_scaled` names it
    QN: tl.constexpr,  # FP8: the scale block
    QK: tl.constexpr,
    QUANTIZE_X: tl.constexpr,  # FP8: x quantized per row and K tile, an e4m3 dot
    FAST: tl.constexpr,  # MXFP4_DOT: fast_math
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    PDL: tl.constexpr,
):
    pdl_enter(PDL)
    e = tl.load(block_expert_ptr + tl.program_id(0))
    if e < 0:
        return
    pairs = tl.load(sorted_pairs_ptr + tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M))
    valid = pairs < num_pairs
    x_rows = x_ptr + (pairs // ROW_DIV).to(tl.int64)[:, None] * stride_x
    n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    nmask = n < N
    w_e, s_e = expert_matrix(w_ptr, s_ptr, e.to(tl.int64), N, K, W_FMT, QN, QK)
    acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    for k0 in range(0, K, BLOCK_K):
        acc = _tile_dot(acc, x_rows, valid, w_e, s_e, n, nmask, k0, K, W_FMT, DOT_FMT, QN, QK,
                        QUANTIZE_X, FAST, BLOCK_N, BLOCK_K, DOT_PRECISION)  # fmt: skip
    if HAS_BIAS:
        bias = tl.load(bias_ptr + e.to(tl.int64) * N + n, mask=nmask, other=0.0)
        acc += bias.to(tl.float32)[None, :]
    if HAS_SCALE:
        acc *= tl.load(scale_ptr + pairs, mask=valid, other=0.0)[:, None]
    out = out_ptr + pairs.to(tl.int64)[:, None] * stride_o + n[None, :]
    tl.store(out, acc.to(out_ptr.dtype.element_ty), mask=valid[:, None] & nmask[None, :])


def grouped_gemm(
    x: torch.Tensor,
    w: torch.Tensor | GemvWeights,
    aligned: AlignedPairs,
    *,
    num_pairs: int,
    row_div: int,
    out: torch.Tensor,
    bias: torch.Tensor | None = None,
    scale: torch.Tensor | None = None,
    quantize_group: int | None = None,
    fast_math: bool = True,
    block_n: int = 64,
    block_k: int = 64,
    num_warps: int = 4,
    num_stages: int = 3,
) -> torch.Tensor:
    """`out[p] = scale[p] * (W[e_p] @ x[p // row_div] + bias[e_p])` for every pair p; `w`
    dense [E, N, K] or any format as `GemvWeights` (DENSE, FP8, MXFP4, MXFP4_DOT: the
    quantized modules' wrappers check their layouts). FP8: `quantize_group` (= `block_k`)
    quantizes x per row and K tile and multiplies in e4m3; MXFP4_DOT: `fast_math` is
    `tl.dot_scaled`'s."""
    gw = GemvWeights.of(w)
    assert gw.fmt in (DENSE, FP8, MXFP4, MXFP4_DOT), gw.fmt
    assert x.dim() == 2 and x.stride(1) == 1 and gw.values.is_contiguous()
    experts, n, k = gw.dims()
    assert x.shape[1] == k and out.shape == (num_pairs, n) and out.stride(1) == 1
    assert quantize_group in (None, block_k) and (quantize_group is None or gw.fmt == FP8)
    if bias is not None:
        assert bias.shape == (experts, n) and bias.is_contiguous()
    if scale is not None:
        assert scale.dtype == torch.float32 and scale.numel() == num_pairs
    if num_pairs == 0:
        return out
    values = gw.values
    _grouped_kernel[(aligned.block_expert.shape[0], triton.cdiv(n, block_n))](
        x, values, values if gw.scales is None else gw.scales, values if bias is None else bias,
        out if scale is None else scale, out, aligned.sorted_pairs, aligned.block_expert,
        num_pairs, n, k, x.stride(0), out.stride(0), ROW_DIV=row_div,
        HAS_BIAS=bias is not None, HAS_SCALE=scale is not None, W_FMT=gw.fmt,
        DOT_FMT=gw.dot_fmt, QN=gw.block[0], QK=gw.block[1],
        QUANTIZE_X=quantize_group is not None, FAST=fast_math, BLOCK_M=aligned.block_m,
        BLOCK_N=block_n, BLOCK_K=block_k,
        DOT_PRECISION="ieee" if x.dtype == torch.float32 else "tf32",
        num_warps=num_warps, num_stages=num_stages, **pdl_args(),
    )  # fmt: skip
    return out
