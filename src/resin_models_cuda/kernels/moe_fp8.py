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

from resin_models_cuda.kernels.activation import Activation
from resin_models_cuda.kernels.fp8_gemm import check_fp8_weight, fp8_tile_fits
from resin_models_cuda.kernels.moe_gemv import (
    DOWN_DEFAULT,
    GATE_UP_DEFAULT,
    GemvTiles,
    GemvWeights,
    expert_down,
    expert_gate_up,
)
from resin_models_cuda.kernels.moe_grouped import AlignedPairs, pair_block, store_pairs
from resin_models_cuda.kernels.quant_tiles import FP8, fp8_quantize_rows


class Fp8Experts(NamedTuple):
    """Stacked FP8 expert matrices: `w` e4m3 [E, N, K], `scale` float32 [E, sn, sk], the
    scale block `(qn, qk)`."""

    w: torch.Tensor
    scale: torch.Tensor
    block: tuple[int, int]

    def check(self, block_k: int, spans: bool = False) -> tuple[int, int, int]:
        """Asserts the layout and that K tiles of `block_k` stay inside a scale block (or,
        `spans`: the GEMV's row-dot, cover whole power-of-two blocks); returns (E, N, K)."""
        assert self.w.dim() == 3, self.w.shape
        check_fp8_weight(self.w, self.scale, self.block)
        e, n, k = self.w.shape
        assert fp8_tile_fits(self.block[1], k, block_k, spans), (self.block, block_k)
        return e, n, k


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
    """`x` [R, H], `w` [E, 2I, H] FP8, `experts` [P] -> activated [P, I]: the expert GEMV
    (`moe_gemv.expert_gate_up`) with the FP8 row-dot."""
    tiles = tiles or GATE_UP_DEFAULT
    w.check(tiles.block_k, spans=True)
    return expert_gate_up(x, fp8_gemv_weights(w), experts, act=act, bias=bias,
                          row_div=row_div, alpha=alpha, limit=limit, out=out,
                          tiles=tiles)  # fmt: skip


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
    [T * topk] -> [T, H]: each token's weighted sum over its experts
    (`moe_gemv.expert_down` with the FP8 row-dot)."""
    tiles = tiles or DOWN_DEFAULT
    w.check(tiles.block_k, spans=True)
    return expert_down(act, fp8_gemv_weights(w), experts, scale, topk, bias=bias, out=out,
                       tiles=tiles)  # fmt: skip


def fp8_gemv_weights(w: Fp8Experts) -> GemvWeights:
    return GemvWeights(w.w, w.scale, FP8, w.block)
