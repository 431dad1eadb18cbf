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
from resin_models_cuda.kernels.moe_grouped import AlignedPairs, grouped_gemm
from resin_models_cuda.kernels.quant_tiles import FP8


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
    """`moe_grouped.grouped_gemm` over FP8 experts; `quantize_group` (= `block_k`): quantize
    `x` per row and group on the fly and multiply in e4m3."""
    w.check(block_k)
    return grouped_gemm(x, fp8_gemv_weights(w), aligned, num_pairs=num_pairs, row_div=row_div,
                        out=out, bias=bias, scale=scale, quantize_group=quantize_group,
                        block_n=block_n, block_k=block_k, num_warps=num_warps,
                        num_stages=num_stages)  # fmt: skip


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
