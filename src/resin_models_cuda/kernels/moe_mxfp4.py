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
  `dot_scaled=False`, decode in registers: the grouped GEMM (`moe_grouped.py`) runs the even
  and odd columns of a K tile as two dots (low and high nibbles) so the bytes never interleave.
- `mxfp4_expert_gate_up` / `mxfp4_expert_down`: per-pair GEMV (through `tl.dot_scaled` on
  the row padded to 16, or in registers: a 3-D tile [rows, groups, 16 bytes] summed per group
  before its scale multiplies once).
Fixed grids, no host sync: CUDA-graph safe.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from resin_models_cuda.kernels.activation import Activation
from resin_models_cuda.kernels.moe_gemv import (
    DOWN_DEFAULT,
    GATE_UP_DEFAULT,
    GemvTiles,
    GemvWeights,
    expert_down,
    expert_gate_up,
)
from resin_models_cuda.kernels.moe_grouped import AlignedPairs, grouped_gemm
from resin_models_cuda.kernels.quant_tiles import MXFP4, MXFP4_DOT, MXFP4_TC

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
    """`moe_grouped.grouped_gemm` over MXFP4 experts (`block_k`: K values per step, a
    multiple of 32)."""
    w.check(block_k)
    return grouped_gemm(x, mxfp4_gemv_weights(w, x, dot_scaled), aligned, num_pairs=num_pairs,
                        row_div=row_div, out=out, bias=bias, scale=scale, fast_math=fast_math,
                        block_n=block_n, block_k=block_k, num_warps=num_warps,
                        num_stages=num_stages)  # fmt: skip


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
    dot_scaled: bool = False,
) -> torch.Tensor:
    """`x` [R, H], `w` [E, 2I, H] MXFP4, `experts` [P] -> activated [P, I]: the expert GEMV
    (`moe_gemv.expert_gate_up`) with the MXFP4 row-dot (`tiles.block_k`: a multiple of 32)."""
    tiles = tiles or GATE_UP_DEFAULT
    w.check(tiles.block_k)
    return expert_gate_up(x, mxfp4_gemv_weights(w, x, dot_scaled, tiles), experts, act=act,
                          bias=bias, row_div=row_div, alpha=alpha, limit=limit, out=out,
                          tiles=tiles)  # fmt: skip


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
    dot_scaled: bool = False,
) -> torch.Tensor:
    """`act` [T * topk, I] (token-major pairs), `w` [E, H, I] MXFP4, `scale` float32
    [T * topk] -> [T, H], as `moe_gemv.expert_down` with the MXFP4 row-dot."""
    tiles = tiles or DOWN_DEFAULT
    w.check(tiles.block_k)
    return expert_down(act, mxfp4_gemv_weights(w, act, dot_scaled, tiles), experts, scale, topk,
                       bias=bias, out=out, tiles=tiles)  # fmt: skip


def mxfp4_gemv_weights(w: Mxfp4Experts, x: torch.Tensor, dot_scaled: bool,
                       tiles: GemvTiles | None = None) -> GemvWeights:  # fmt: skip
    """The GEMV's view of `w`: decoded in registers to float32 for FMAs
    (`quant_tiles.e2m1_bits`), to x's dtype for the tensor cores (`tiles.tensor_core`:
    `e2m1_to_bf16`, the row padded to 16; 16-row tiles), or through `tl.dot_scaled` when
    asked for and `x` is 16-bit."""
    if tiles is not None and tiles.tensor_core and not dot_scaled:
        assert tiles.block_n >= 16, f"tensor-core tiles are 16 rows or more: {tiles}"
        return GemvWeights(w.blocks, w.scales, MXFP4_TC)
    fmt = _dot_format(x, dot_scaled)
    if fmt == "fp32":
        return GemvWeights(w.blocks, w.scales, MXFP4)
    return GemvWeights(w.blocks, w.scales, MXFP4_DOT, dot_fmt=fmt)
