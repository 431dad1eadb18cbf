# mypy: disable-error-code="untyped-decorator,no-untyped-def"
"""MoE experts with FP8 e4m3 weights (Qwen3-*-FP8, DeepSeek-V3: 128 x 128 scale blocks; any
`resin_model.quant` scale block works): the fused grouped GEMM of `moe_grouped.py` and the
expert GEMV of `moe_gemv.py`, reading one byte per weight and converting it in registers.

Weights (`Fp8Experts`): `w` e4m3 [E, N, K] and float32 `scale` [E, cdiv(N, qn), cdiv(K, qk)],
`W[e, n, k] = w[e, n, k] * scale[e, n // qn, k // qk]`; a K tile lies inside one scale block
(`qk % BLOCK_K == 0`, or one block spans K), so each row's partial sum takes its scale once
per tile. The routing inputs are the bf16 kernels' (pairs aligned by `align_pairs`, or one
expert id per pair), so the MoE layer swaps kernels, not routing.

- `fp8_grouped_gemm`: weight-only (the dot in `x`'s dtype), or with `quantize_group =
  BLOCK_K` each program quantizes its activation tile per row and group (block FP8's
  activation scheme) and runs an e4m3 dot: for prefill, where the matmul is compute-bound.
- `fp8_expert_gate_up` / `fp8_expert_down`: weight-only GEMV (decode: the bytes are the
  weights); gate_up fuses the activation, down adds weighted pairs into a zeroed float32 sum
  (`moe_gemv`'s scheme). One expert of weight 1 makes `fp8_expert_down` a dense FP8 GEMV.
Fixed grids, no host sync: CUDA-graph safe.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import triton
import triton.language as tl

from resin_models_cuda.kernels.activation import ACTIVATION_CODES, Activation, gated
from resin_models_cuda.kernels.fp8_gemm import check_fp8_weight
from resin_models_cuda.kernels.moe_gemv import DOWN_DEFAULT, GATE_UP_DEFAULT, GemvTiles
from resin_models_cuda.kernels.moe_grouped import AlignedPairs, pair_block, store_pairs
from resin_models_cuda.kernels.quant_tiles import fp8_quantize_rows


class Fp8Experts(NamedTuple):
    """Stacked FP8 expert matrices: `w` e4m3 [E, N, K], `scale` float32 [E, sn, sk], the
    scale block `(qn, qk)`."""

    w: torch.Tensor
    scale: torch.Tensor
    block: tuple[int, int]

    def check(self, block_k: int) -> tuple[int, int, int]:
        """Asserts the layout and that K tiles of `block_k` stay inside a scale block;
        returns (E, N, K)."""
        assert self.w.dim() == 3, self.w.shape
        check_fp8_weight(self.w, self.scale, self.block)
        e, n, k = self.w.shape
        assert self.block[1] % block_k == 0 or self.block[1] >= k, (self.block, block_k)
        return e, n, k


@triton.jit
def _fp8_rows_dot(x_ptr, w_ptr, s_ptr, n, nmask, K, QN: tl.constexpr, QK: tl.constexpr,
                  BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):  # fmt: skip
    """float32 `W[n, :] @ x` for rows `n` of one expert's e4m3 [N, K] matrix (scales at
    `s_ptr`, [cdiv(N, QN), cdiv(K, QK)])."""
    acc = tl.zeros([BLOCK_N, BLOCK_K], tl.float32)
    scale_row = s_ptr + (n // QN) * tl.cdiv(K, QK)
    for k0 in range(0, K, BLOCK_K):
        k = k0 + tl.arange(0, BLOCK_K)
        kmask = k < K
        x = tl.load(x_ptr + k, mask=kmask, other=0.0).to(tl.float32)
        w = tl.load(w_ptr + n[:, None] * K + k[None, :], mask=nmask[:, None] & kmask[None, :],
                    other=0.0)  # fmt: skip
        if QK >= K:  # per-channel / per-tensor: one scale per row, applied after the loop
            acc += w.to(tl.float32) * x[None, :]
        else:  # measured faster on the H200 than a per-block reduction in the loop
            s = tl.load(scale_row + k0 // QK, mask=nmask, other=0.0)
            acc += w.to(tl.float32) * (x[None, :] * s[:, None])
    y = tl.sum(acc, 1)
    if QK >= K:
        y *= tl.load(scale_row, mask=nmask, other=0.0)
    return y


@triton.jit
def _fp8_gate_up_kernel(
    x_ptr,  # [R, K], row stride stride_x
    w_ptr,  # e4m3 [E, 2I, K]: gate rows, then up rows
    s_ptr,  # float32 [E, cdiv(2I, QN), cdiv(K, QK)]
    expert_ptr,  # int [P]
    bias_ptr,  # [E, 2I] (HAS_BIAS)
    out_ptr,  # [P, I], row stride stride_o
    stride_x,
    stride_o,
    INTER,
    K,
    alpha,
    limit,
    QN: tl.constexpr,
    QK: tl.constexpr,
    ROW_DIV: tl.constexpr,
    ACT: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    p = tl.program_id(0)
    n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    nmask = n < INTER
    e = tl.load(expert_ptr + p).to(tl.int64)
    x_row = x_ptr + (p // ROW_DIV).to(tl.int64) * stride_x
    w_e = w_ptr + e * 2 * INTER * K
    s_e = s_ptr + e * tl.cdiv(2 * INTER, QN) * tl.cdiv(K, QK)
    gate = _fp8_rows_dot(x_row, w_e, s_e, n, nmask, K, QN, QK, BLOCK_N, BLOCK_K)
    up = _fp8_rows_dot(x_row, w_e, s_e, n + INTER, nmask, K, QN, QK, BLOCK_N, BLOCK_K)
    if HAS_BIAS:
        gate += tl.load(bias_ptr + e * 2 * INTER + n, mask=nmask, other=0.0).to(tl.float32)
        up += tl.load(bias_ptr + e * 2 * INTER + INTER + n, mask=nmask, other=0.0).to(tl.float32)
    dtype = out_ptr.dtype.element_ty
    out = gated(gate.to(dtype).to(tl.float32), up.to(dtype).to(tl.float32), alpha, limit, ACT,
                dtype)  # fmt: skip
    tl.store(out_ptr + p.to(tl.int64) * stride_o + n, out.to(dtype), mask=nmask)


@triton.jit
def _fp8_down_kernel(
    act_ptr,  # [T * TOPK, K], row stride stride_a
    w_ptr,  # e4m3 [E, N, K]
    s_ptr,  # float32 [E, cdiv(N, QN), cdiv(K, QK)]
    expert_ptr,  # int [T * TOPK]
    scale_ptr,  # float32 [T * TOPK]: routing weights
    bias_ptr,  # [E, N] (HAS_BIAS)
    out_ptr,  # float32 [T, N] zeroed, row stride stride_o
    stride_a,
    stride_o,
    N,
    K,
    QN: tl.constexpr,
    QK: tl.constexpr,
    TOPK: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    p = tl.program_id(0).to(tl.int64)
    n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    nmask = n < N
    e = tl.load(expert_ptr + p).to(tl.int64)
    s_e = s_ptr + e * tl.cdiv(N, QN) * tl.cdiv(K, QK)
    y = _fp8_rows_dot(act_ptr + p * stride_a, w_ptr + e * N * K, s_e, n, nmask, K, QN, QK,
                      BLOCK_N, BLOCK_K)  # fmt: skip
    if HAS_BIAS:
        y += tl.load(bias_ptr + e * N + n, mask=nmask, other=0.0).to(tl.float32)
    tl.atomic_add(out_ptr + (p // TOPK) * stride_o + n, tl.load(scale_ptr + p) * y, mask=nmask)


@triton.jit
def _fp8_grouped_kernel(
    x_ptr,  # [R, K] float, row stride stride_x
    w_ptr,  # e4m3 [E, N, K]
    s_ptr,  # float32 [E, cdiv(N, QN), cdiv(K, QK)]
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
    QN: tl.constexpr,
    QK: tl.constexpr,
    ROW_DIV: tl.constexpr,
    QUANTIZE_X: tl.constexpr,
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
    w_e = w_ptr + e.to(tl.int64) * N * K
    scale_row = (
        s_ptr + e.to(tl.int64) * tl.cdiv(N, QN) * tl.cdiv(K, QK) + (n // QN) * tl.cdiv(K, QK)
    )
    acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    for k0 in range(0, K, BLOCK_K):
        k = k0 + tl.arange(0, BLOCK_K)
        kmask = k < K
        a = tl.load(x_ptr + rows[:, None] * stride_x + k[None, :],
                    mask=valid[:, None] & kmask[None, :], other=0.0)  # fmt: skip
        b = tl.load(w_e + n[None, :].to(tl.int64) * K + k[:, None],
                    mask=nmask[None, :] & kmask[:, None], other=0.0)  # fmt: skip
        if QUANTIZE_X:
            a_q, a_scale = fp8_quantize_rows(a.to(tl.float32))
            part = tl.dot(a_q, b) * a_scale[:, None]
        else:
            part = tl.dot(a, b.to(a.dtype), input_precision=DOT_PRECISION)
        acc += part * tl.load(scale_row + k0 // QK, mask=nmask, other=0.0)[None, :]
    store_pairs(acc, e, pairs, valid, n, nmask, bias_ptr, scale_ptr, out_ptr, N, stride_o,
                HAS_BIAS, HAS_SCALE)  # fmt: skip


def fp8_grouped_gemm(
    x: torch.Tensor,
    w: Fp8Experts,
    aligned: AlignedPairs,
    *,
    num_pairs: int,
    row_div: int,
    out: torch.Tensor,
    bias: torch.Tensor | None = None,
    scale: torch.Tensor | None = None,
    quantize_group: int | None = None,
    block_n: int = 64,
    block_k: int = 128,
    num_warps: int = 4,
    num_stages: int = 3,
) -> torch.Tensor:
    """`out[p] = scale[p] * (W[e_p] @ x[p // row_div] + bias[e_p])` for every pair p, as
    `moe_grouped.grouped_gemm`; `quantize_group` (= `block_k`): quantize `x` per row and group
    on the fly and multiply in e4m3."""
    assert x.dim() == 2 and x.stride(1) == 1
    experts, n, k = w.check(block_k)
    assert x.shape[1] == k and out.shape == (num_pairs, n) and out.stride(1) == 1
    assert quantize_group in (None, block_k), (quantize_group, block_k)
    if bias is not None:
        assert bias.shape == (experts, n) and bias.is_contiguous()
    if scale is not None:
        assert scale.dtype == torch.float32 and scale.numel() == num_pairs
    if num_pairs == 0:
        return out
    _fp8_grouped_kernel[(aligned.block_expert.shape[0], triton.cdiv(n, block_n))](
        x, w.w, w.scale, w.w if bias is None else bias, out if scale is None else scale, out,
        aligned.sorted_pairs, aligned.block_expert, num_pairs, n, k, x.stride(0),
        out.stride(0), QN=w.block[0], QK=w.block[1], ROW_DIV=row_div,
        QUANTIZE_X=quantize_group is not None, HAS_BIAS=bias is not None,
        HAS_SCALE=scale is not None, BLOCK_M=aligned.block_m, BLOCK_N=block_n, BLOCK_K=block_k,
        DOT_PRECISION="ieee" if x.dtype == torch.float32 else "tf32",
        num_warps=num_warps, num_stages=num_stages,
    )  # fmt: skip
    return out


def fp8_expert_gate_up(
    x: torch.Tensor,
    w: Fp8Experts,
    experts: torch.Tensor,
    *,
    act: Activation = "silu",
    bias: torch.Tensor | None = None,
    row_div: int = 1,
    alpha: float = 1.702,
    limit: float = 7.0,
    out: torch.Tensor | None = None,
    tiles: GemvTiles | None = None,
) -> torch.Tensor:
    """`x` [R, H], `w` [E, 2I, H] FP8, `experts` [P] -> activated [P, I], as
    `moe_gemv.expert_gate_up`."""
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
        _fp8_gate_up_kernel[(pairs, triton.cdiv(inner, tiles.block_n))](
            x, w.w, w.scale, experts, w.w if bias is None else bias, out, x.stride(0),
            out.stride(0), inner, k, alpha, limit, QN=w.block[0], QK=w.block[1],
            ROW_DIV=row_div, ACT=ACTIVATION_CODES[act], HAS_BIAS=bias is not None,
            BLOCK_N=tiles.block_n, BLOCK_K=tiles.block_k, num_warps=tiles.num_warps,
            num_stages=tiles.num_stages,
        )  # fmt: skip
    return out


def fp8_expert_down(
    act: torch.Tensor,
    w: Fp8Experts,
    experts: torch.Tensor,
    scale: torch.Tensor,
    topk: int,
    *,
    bias: torch.Tensor | None = None,
    out: torch.Tensor | None = None,
    tiles: GemvTiles | None = None,
) -> torch.Tensor:
    """`act` [T * topk, I] (token-major pairs), `w` [E, H, I] FP8, `scale` float32
    [T * topk] -> [T, H]: each token's weighted sum over its experts, as
    `moe_gemv.expert_down`."""
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
    _fp8_down_kernel[(pairs, triton.cdiv(n, tiles.block_n))](
        act, w.w, w.scale, experts, scale, w.w if bias is None else bias, summed,
        act.stride(0), summed.stride(0), n, k, QN=w.block[0], QK=w.block[1], TOPK=topk,
        HAS_BIAS=bias is not None, BLOCK_N=tiles.block_n, BLOCK_K=tiles.block_k,
        num_warps=tiles.num_warps, num_stages=tiles.num_stages,
    )  # fmt: skip
    return out.copy_(summed)
