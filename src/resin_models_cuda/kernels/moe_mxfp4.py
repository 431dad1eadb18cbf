# mypy: disable-error-code="untyped-decorator,no-untyped-def"
"""MoE experts with MXFP4 weights, kept as published (gpt-oss `*_blocks` + `*_scales`): the
fused grouped GEMM of `moe_grouped.py` and the expert GEMV of `moe_gemv.py`, each weight read
as half a byte and dequantized in registers (`resin_model.quant` defines the format).

Weights (`Mxfp4Experts`): `blocks` uint8 [E, N, K / 32, 16] (32 e2m1 values per block, element
2j in the low nibble of byte j) and `scales` uint8 [E, N, K / 32] (e8m0):
`W[e, n, k] = e2m1(e, n, k) * 2 ** (scales[e, n, k // 32] - 127)`. Rows may be permuted at
load (gate rows, then up rows) since each row's blocks stand alone. Activations stay in their
dtype (bf16; float32 / float16 under the interpreter); the e2m1 decode is integer arithmetic
(`quant_tiles.e2m1_x4`) and the scale is built from its exponent bits, so every dequantized
weight is exact in bf16.

- bf16 / fp16 activations go to `tl.dot_scaled` (packed e2m1 tile + e8m0 scales; Triton
  upcasts in registers on Hopper), with `fast_math` (e8m0's NaN code 255 is not propagated:
  no weight uses it; 1.3-1.4x faster on the H200 than without). float32 activations, or
  `dot_scaled=False`, decode in registers here: `mxfp4_grouped_gemm` runs the even and odd
  columns of a K tile as two dots (low and high nibbles) so the bytes never interleave.
- `mxfp4_expert_gate_up` / `mxfp4_expert_down`: per-pair GEMV (through `tl.dot_scaled` on
  the row padded to 16, or in registers: a 3-D tile [rows, groups, 16 bytes] summed per group
  before its scale multiplies once).
Fixed grids, no host sync: CUDA-graph safe.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import triton
import triton.language as tl

from resin_models_cuda.kernels.activation import ACTIVATION_CODES, Activation, gated
from resin_models_cuda.kernels.moe_gemv import DOWN_DEFAULT, GATE_UP_DEFAULT, GemvTiles
from resin_models_cuda.kernels.moe_grouped import AlignedPairs, pair_block, store_pairs
from resin_models_cuda.kernels.quant_tiles import mxfp4_rows_dot, mxfp4_tile

GROUP = 32


class Mxfp4Experts(NamedTuple):
    """Stacked MXFP4 expert matrices: `blocks` uint8 [E, N, K / 32, 16], `scales` uint8
    [E, N, K / 32], both contiguous."""

    blocks: torch.Tensor
    scales: torch.Tensor

    def check(self, block_k: int) -> tuple[int, int, int]:
        """Asserts the layout and that K tiles of `block_k` are whole groups; returns
        (E, N, K)."""
        b, s = self.blocks, self.scales
        assert b.dtype == torch.uint8 and s.dtype == torch.uint8, (b.dtype, s.dtype)
        assert b.dim() == 4 and b.shape[3] == GROUP // 2 and b.shape[:3] == s.shape, (
            b.shape, s.shape)  # fmt: skip
        assert b.is_contiguous() and s.is_contiguous()
        assert block_k % GROUP == 0, block_k
        e, n, g = s.shape
        return e, n, g * GROUP


@triton.jit
def _mxfp4_gate_up_kernel(
    x_ptr,  # [R, K], row stride stride_x
    b_ptr,  # uint8 [E, 2I, K / 2]: gate rows, then up rows
    s_ptr,  # uint8 [E, 2I, K / 32]
    expert_ptr,  # int [P]
    bias_ptr,  # [E, 2I] (HAS_BIAS)
    out_ptr,  # [P, I], row stride stride_o
    stride_x,
    stride_o,
    INTER,
    K,
    alpha,
    limit,
    ROW_DIV: tl.constexpr,
    ACT: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    FMT: tl.constexpr,
    FAST: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_G: tl.constexpr,
):
    p = tl.program_id(0)
    n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    nmask = n < INTER
    e = tl.load(expert_ptr + p).to(tl.int64)
    x_row = x_ptr + (p // ROW_DIV).to(tl.int64) * stride_x
    b_e = b_ptr + e * 2 * INTER * (K // 2)
    s_e = s_ptr + e * 2 * INTER * (K // 32)
    gate = mxfp4_rows_dot(x_row, b_e, s_e, n, nmask, K, FMT, FAST, BLOCK_N, BLOCK_G)
    up = mxfp4_rows_dot(x_row, b_e, s_e, n + INTER, nmask, K, FMT, FAST, BLOCK_N, BLOCK_G)
    if HAS_BIAS:
        gate += tl.load(bias_ptr + e * 2 * INTER + n, mask=nmask, other=0.0).to(tl.float32)
        up += tl.load(bias_ptr + e * 2 * INTER + INTER + n, mask=nmask, other=0.0).to(tl.float32)
    dtype = out_ptr.dtype.element_ty
    out = gated(gate.to(dtype).to(tl.float32), up.to(dtype).to(tl.float32), alpha, limit, ACT,
                dtype)  # fmt: skip
    tl.store(out_ptr + p.to(tl.int64) * stride_o + n, out.to(dtype), mask=nmask)


@triton.jit
def _mxfp4_down_kernel(
    act_ptr,  # [T * TOPK, K], row stride stride_a
    b_ptr,  # uint8 [E, N, K / 2]
    s_ptr,  # uint8 [E, N, K / 32]
    expert_ptr,  # int [T * TOPK]
    scale_ptr,  # float32 [T * TOPK]: routing weights
    bias_ptr,  # [E, N] (HAS_BIAS)
    out_ptr,  # float32 [T, N] zeroed, row stride stride_o
    stride_a,
    stride_o,
    N,
    K,
    TOPK: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    FMT: tl.constexpr,
    FAST: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_G: tl.constexpr,
):
    p = tl.program_id(0).to(tl.int64)
    n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    nmask = n < N
    e = tl.load(expert_ptr + p).to(tl.int64)
    b_e, s_e = b_ptr + e * N * (K // 2), s_ptr + e * N * (K // 32)
    y = mxfp4_rows_dot(act_ptr + p * stride_a, b_e, s_e, n, nmask, K, FMT, FAST, BLOCK_N, BLOCK_G)
    if HAS_BIAS:
        y += tl.load(bias_ptr + e * N + n, mask=nmask, other=0.0).to(tl.float32)
    tl.atomic_add(out_ptr + (p // TOPK) * stride_o + n, tl.load(scale_ptr + p) * y, mask=nmask)


@triton.jit
def _mxfp4_grouped_kernel(
    x_ptr,  # [R, K] float, row stride stride_x
    b_ptr,  # uint8 [E, N, K / 2]
    s_ptr,  # uint8 [E, N, K / 32]
    bias_ptr,  # [E, N] (HAS_BIAS)
    scale_ptr,  # float32 [P] routing weights (HAS_SCALE)
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
    FMT: tl.constexpr,
    FAST: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_G: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
):
    e = tl.load(block_expert_ptr + tl.program_id(0))
    if e < 0:
        return
    pairs, valid, rows, n, nmask = pair_block(sorted_pairs_ptr, num_pairs, N, ROW_DIV, BLOCK_M,
                                              BLOCK_N)  # fmt: skip
    b_e = b_ptr + e.to(tl.int64) * N * (K // 2)
    s_e = s_ptr + e.to(tl.int64) * N * (K // 32)
    acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    for g0 in range(0, K // 32, BLOCK_G):
        if FMT == "fp32":  # dequantize in registers; even and odd columns as two dots
            byte = g0 * 16 + tl.arange(0, BLOCK_G * 16)
            amask = valid[:, None] & (byte < K // 2)[None, :]
            a_ptr = x_ptr + rows[:, None] * stride_x + 2 * byte[None, :]
            a_even = tl.load(a_ptr, mask=amask, other=0.0)
            a_odd = tl.load(a_ptr + 1, mask=amask, other=0.0)
            low = mxfp4_tile(b_e, s_e, n, nmask, g0, K, BLOCK_N, BLOCK_G, False)
            acc += tl.dot(a_even, low.to(a_even.dtype), input_precision=DOT_PRECISION)
            high = mxfp4_tile(b_e, s_e, n, nmask, g0, K, BLOCK_N, BLOCK_G, True)
            acc += tl.dot(a_odd, high.to(a_odd.dtype), input_precision=DOT_PRECISION)
        else:  # the packed tile and its scales straight to tl.dot_scaled
            k = g0 * 32 + tl.arange(0, BLOCK_G * 32)
            a = tl.load(x_ptr + rows[:, None] * stride_x + k[None, :],
                        mask=valid[:, None] & (k < K)[None, :], other=0.0)  # fmt: skip
            byte = g0 * 16 + tl.arange(0, BLOCK_G * 16)
            g = g0 + tl.arange(0, BLOCK_G)
            w = tl.load(b_e + n[None, :].to(tl.int64) * (K // 2) + byte[:, None],
                        mask=nmask[None, :] & (byte < K // 2)[:, None], other=0)  # fmt: skip
            scale = tl.load(s_e + n[:, None].to(tl.int64) * (K // 32) + g[None, :],
                            mask=nmask[:, None] & (g < K // 32)[None, :], other=0)  # fmt: skip
            acc = tl.dot_scaled(a, None, FMT, w, scale, "e2m1", acc, fast_math=FAST)
    store_pairs(acc, e, pairs, valid, n, nmask, bias_ptr, scale_ptr, out_ptr, N, stride_o,
                HAS_BIAS, HAS_SCALE)  # fmt: skip


def _dot_format(x: torch.Tensor, dot_scaled: bool) -> str:
    """`tl.dot_scaled`'s name for `x`'s dtype, or "fp32": dequantize in registers instead."""
    if not dot_scaled or x.dtype == torch.float32:
        return "fp32"
    return {torch.bfloat16: "bf16", torch.float16: "fp16"}[x.dtype]


def mxfp4_grouped_gemm(
    x: torch.Tensor,
    w: Mxfp4Experts,
    aligned: AlignedPairs,
    *,
    num_pairs: int,
    row_div: int,
    out: torch.Tensor,
    bias: torch.Tensor | None = None,
    scale: torch.Tensor | None = None,
    dot_scaled: bool = True,
    fast_math: bool = True,
    block_n: int = 64,
    block_k: int = 64,
    num_warps: int = 4,
    num_stages: int = 3,
) -> torch.Tensor:
    """`out[p] = scale[p] * (W[e_p] @ x[p // row_div] + bias[e_p])` for every pair p, as
    `moe_grouped.grouped_gemm` (`block_k`: K values per step, a multiple of 32)."""
    assert x.dim() == 2 and x.stride(1) == 1
    experts, n, k = w.check(block_k)
    assert x.shape[1] == k and out.shape == (num_pairs, n) and out.stride(1) == 1
    if bias is not None:
        assert bias.shape == (experts, n) and bias.is_contiguous()
    if scale is not None:
        assert scale.dtype == torch.float32 and scale.numel() == num_pairs
    if num_pairs == 0:
        return out
    _mxfp4_grouped_kernel[(aligned.block_expert.shape[0], triton.cdiv(n, block_n))](
        x, w.blocks, w.scales, w.blocks if bias is None else bias,
        out if scale is None else scale, out, aligned.sorted_pairs, aligned.block_expert,
        num_pairs, n, k, x.stride(0), out.stride(0), ROW_DIV=row_div,
        HAS_BIAS=bias is not None, HAS_SCALE=scale is not None,
        FMT=_dot_format(x, dot_scaled), FAST=fast_math, BLOCK_M=aligned.block_m,
        BLOCK_N=block_n, BLOCK_G=block_k // GROUP,
        DOT_PRECISION="ieee" if x.dtype == torch.float32 else "tf32",
        num_warps=num_warps, num_stages=num_stages,
    )  # fmt: skip
    return out


def mxfp4_expert_gate_up(
    x: torch.Tensor,
    w: Mxfp4Experts,
    experts: torch.Tensor,
    *,
    act: Activation = "silu",
    bias: torch.Tensor | None = None,
    row_div: int = 1,
    alpha: float = 1.702,
    limit: float = 7.0,
    out: torch.Tensor | None = None,
    tiles: GemvTiles | None = None,
    dot_scaled: bool = True,
    fast_math: bool = True,
) -> torch.Tensor:
    """`x` [R, H], `w` [E, 2I, H] MXFP4, `experts` [P] -> activated [P, I], as
    `moe_gemv.expert_gate_up` (`tiles.block_k`: a multiple of 32)."""
    tiles = tiles or GATE_UP_DEFAULT
    assert x.dim() == 2 and x.stride(1) == 1 and experts.dim() == 1
    num_experts, two_inner, k = w.check(tiles.block_k)
    assert x.shape[1] == k and two_inner % 2 == 0
    inner, pairs = two_inner // 2, experts.shape[0]
    if bias is not None:
        assert bias.shape == (num_experts, two_inner) and bias.is_contiguous()
    if out is None:
        out = torch.empty((pairs, inner), dtype=x.dtype, device=x.device)
    assert out.shape == (pairs, inner) and out.stride(1) == 1
    if pairs:
        _mxfp4_gate_up_kernel[(pairs, triton.cdiv(inner, tiles.block_n))](
            x, w.blocks, w.scales, experts, w.blocks if bias is None else bias, out,
            x.stride(0), out.stride(0), inner, k, alpha, limit, ROW_DIV=row_div,
            ACT=ACTIVATION_CODES[act], HAS_BIAS=bias is not None,
            FMT=_dot_format(x, dot_scaled), FAST=fast_math, BLOCK_N=tiles.block_n,
            BLOCK_G=tiles.block_k // GROUP, num_warps=tiles.num_warps,
            num_stages=tiles.num_stages,
        )  # fmt: skip
    return out


def mxfp4_expert_down(
    act: torch.Tensor,
    w: Mxfp4Experts,
    experts: torch.Tensor,
    scale: torch.Tensor,
    topk: int,
    *,
    bias: torch.Tensor | None = None,
    out: torch.Tensor | None = None,
    tiles: GemvTiles | None = None,
    dot_scaled: bool = True,
    fast_math: bool = True,
) -> torch.Tensor:
    """`act` [T * topk, I] (token-major pairs), `w` [E, H, I] MXFP4, `scale` float32
    [T * topk] -> [T, H], as `moe_gemv.expert_down`."""
    tiles = tiles or DOWN_DEFAULT
    assert act.dim() == 2 and act.stride(1) == 1
    num_experts, n, k = w.check(tiles.block_k)
    pairs = experts.shape[0]
    assert act.shape == (pairs, k) and pairs % topk == 0
    assert scale.dtype == torch.float32 and scale.shape == (pairs,) and scale.is_contiguous()
    if bias is not None:
        assert bias.shape == (num_experts, n) and bias.is_contiguous()
    tokens = pairs // topk
    if out is None:
        out = torch.empty((tokens, n), dtype=act.dtype, device=act.device)
    assert out.shape == (tokens, n) and out.stride(1) == 1
    if not tokens:
        return out
    summed = torch.zeros((tokens, n), dtype=torch.float32, device=act.device)
    _mxfp4_down_kernel[(pairs, triton.cdiv(n, tiles.block_n))](
        act, w.blocks, w.scales, experts, scale, w.blocks if bias is None else bias, summed,
        act.stride(0), summed.stride(0), n, k, TOPK=topk, HAS_BIAS=bias is not None,
        FMT=_dot_format(act, dot_scaled), FAST=fast_math, BLOCK_N=tiles.block_n,
        BLOCK_G=tiles.block_k // GROUP, num_warps=tiles.num_warps, num_stages=tiles.num_stages,
    )  # fmt: skip
    return out.copy_(summed)
