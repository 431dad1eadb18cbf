"""Mixture of experts as a layer: router, then the experts through one of two graph-safe
paths with the same result (no host sync in either, so decode CUDA graphs cover every batch).

- Router: softmax, sigmoid or sqrt(softplus) scores over a (biased) linear, optional
  group-limited choice and score bias (DeepSeek), top-k (or the experts a token-id table
  names: DeepSeek-V4's hash layers), optional renormalization and scale, in one kernel; shared
  experts ride along as always-chosen experts of weight 1 (`ExpertWeights.with_shared`). At
  1..16 tokens the linear joins that kernel (`MoE.fused_router`), one launch for the router.
- Few pairs (`pairs <= gemv_max_pairs`): the expert GEMV (`kernels/moe_gemv.py`), each pair
  reading its expert in place: gate_up with the activation fused, then down adding each
  weighted pair into a zeroed float32 sum (and a cast).
- Otherwise: pairs sorted by expert on the device and the fused grouped GEMM
  (`kernels/moe_grouped.py`), one launch per projection, then a sum over each token's k rows.

Experts are stacked `gate_up` [E, 2I, H] (gate rows first, then up) and `down` [E, H, I], with
optional biases [E, 2I] / [E, H]; the activation is SiLU-gated, gpt-oss's clamped SwiGLU or
DeepSeek-V4's clamped SiLU gate (`kernels/activation.py`).
Each stack is dense, FP8 (`Fp8Experts`: `kernels/moe_fp8.py`) or MXFP4 (`Mxfp4Experts`:
`kernels/moe_mxfp4.py`); the same two paths run the matching kernels, the routing unchanged.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from resin_model.config import MoeConfig
from resin_model.quant import dequantize_fp8
from resin_models_cuda.kernels.activation import Activation, gated_activation
from resin_models_cuda.kernels.fp8_gemm import fp8_tile_fits
from resin_models_cuda.kernels.moe_fp8 import (
    Fp8Experts,
    fp8_expert_down,
    fp8_expert_gate_up,
    fp8_grouped_gemm,
)
from resin_models_cuda.kernels.moe_gemv import GemvTiles, expert_down, expert_gate_up, tiles_for
from resin_models_cuda.kernels.moe_grouped import AlignedPairs, align_pairs, grouped_gemm
from resin_models_cuda.kernels.moe_mxfp4 import (
    Mxfp4Experts,
    mxfp4_expert_down,
    mxfp4_expert_gate_up,
    mxfp4_grouped_gemm,
)
from resin_models_cuda.kernels.router import FUSED_MAX_TOKENS, fused_router_topk, router_topk
from resin_models_cuda.layers.quantized import (
    Fp8Weight,
    cat_fp8,
    slice_fp8,
    stack_fp8,
    unstack_fp8,
)

Experts = torch.Tensor | Fp8Experts | Mxfp4Experts
QUANTIZE_PAIRS = 4096  # from this many pairs block-FP8 experts multiply in e4m3 (prefill)


def expert_shape(w: Experts) -> tuple[int, int, int]:
    """(E, N, K) of a stack in any format."""
    if isinstance(w, Fp8Experts):
        e, n, k = w.w.shape
    elif isinstance(w, Mxfp4Experts):
        e, n, g = w.scales.shape
        k = g * 32
    else:
        e, n, k = w.shape
    return int(e), int(n), int(k)


def _gemv_tiles(tiles: GemvTiles, w: Experts) -> GemvTiles:
    """K tiles inside one FP8 scale block, or over whole ones."""
    if isinstance(w, Fp8Experts):
        qk, k = w.block[1], w.w.shape[2]
        if not fp8_tile_fits(qk, k, tiles.block_k, spans=True):
            return tiles._replace(block_k=qk)
    return tiles


def format_name(w: Experts) -> str:
    """The tile files' name of a stack's format."""
    if isinstance(w, Fp8Experts):
        k = w.w.shape[2]
        return "fp8-channel" if w.block[1] >= k else "fp8-block"
    return "mxfp4" if isinstance(w, Mxfp4Experts) else "dense"


def _gate_up_kernel(w: Experts) -> Callable[..., torch.Tensor]:
    if isinstance(w, Fp8Experts):
        return fp8_expert_gate_up
    return mxfp4_expert_gate_up if isinstance(w, Mxfp4Experts) else expert_gate_up


def _down_kernel(w: Experts) -> Callable[..., torch.Tensor]:
    if isinstance(w, Fp8Experts):
        return fp8_expert_down
    return mxfp4_expert_down if isinstance(w, Mxfp4Experts) else expert_down


def _grouped_gemm(
    x: torch.Tensor,
    w: Experts,
    aligned: AlignedPairs,
    *,
    num_pairs: int,
    row_div: int,
    out: torch.Tensor,
    bias: torch.Tensor | None = None,
    scale: torch.Tensor | None = None,
) -> torch.Tensor:
    """The grouped GEMM of `w`'s format (block-FP8 prefill quantizes `x` per 128 columns)."""
    if isinstance(w, Fp8Experts):
        qk, k = w.block[1], w.w.shape[2]
        block_k = qk if qk < k and qk % 128 else 128
        big = num_pairs >= QUANTIZE_PAIRS and x.dtype != torch.float32 and qk % 128 == 0
        group = 128 if big and block_k == 128 else None
        return fp8_grouped_gemm(
            x, w, aligned, num_pairs=num_pairs, row_div=row_div, out=out, bias=bias,
            scale=scale, quantize_group=group, block_k=block_k,
        )  # fmt: skip
    if isinstance(w, Mxfp4Experts):
        return mxfp4_grouped_gemm(
            x, w, aligned, num_pairs=num_pairs, row_div=row_div, out=out, bias=bias, scale=scale
        )
    return grouped_gemm(
        x, w, aligned, num_pairs=num_pairs, row_div=row_div, out=out, bias=bias, scale=scale
    )


def _dense(w: torch.Tensor | Fp8Weight, dtype: torch.dtype) -> torch.Tensor:
    """`w` as a dense matrix of `dtype` (FP8 dequantized through float32)."""
    if isinstance(w, Fp8Weight):
        return dequantize_fp8(w.w, w.scale, w.block).to(dtype)
    return w


@dataclass(frozen=True, slots=True)
class ExpertWeights:
    """Stacked experts; `shared` trailing experts of `gate_up` / `down` (none of the router's
    rows) run for every token with weight 1 (DeepSeek's shared experts, see `with_shared`)."""

    router: torch.Tensor  # [E, H]
    router_bias: torch.Tensor | None  # [E]
    gate_up: Experts  # [E + shared, 2I, H]
    gate_up_bias: torch.Tensor | None  # [E + shared, 2I]
    down: Experts  # [E + shared, H, I]
    down_bias: torch.Tensor | None  # [E + shared, H]
    score_bias: torch.Tensor | None = None  # fp32 [E]: steers the choice, not the weights
    shared: int = 0
    hash_table: torch.Tensor | None = None  # int32 [vocab, k]: a token's experts (no top-k)

    def with_shared(
        self, gate_up: torch.Tensor | Fp8Weight, down: torch.Tensor | Fp8Weight
    ) -> ExpertWeights:
        """Append a gated MLP (`gate_up` [2S, H] as [gate; up], `down` [H, S], S a multiple
        of the expert width I) as S / I always-on experts: an MLP is a sum over its inner
        dimension, so its slices of width I are experts of weight 1. The shared slices take
        the routed stack's format: FP8 routed experts take FP8 shared ones (scales sliced with
        them; GLM-4.5-Air-FP8, DeepSeek-V3), dense routed experts take dense or FP8 shared
        ones (FP8 dequantized into the stack's dtype). MXFP4 routed experts, or dense shared
        ones beside FP8 routed experts, have no exact common format: refused."""
        inner = expert_shape(self.down)[2]
        routed_fp8 = isinstance(self.gate_up, Fp8Experts) and isinstance(self.down, Fp8Experts)
        shared_fp8 = isinstance(gate_up, Fp8Weight) and isinstance(down, Fp8Weight)
        if routed_fp8:
            if not shared_fp8:
                raise ValueError("FP8 routed experts need FP8 shared experts (got dense ones)")
            assert isinstance(gate_up, Fp8Weight) and isinstance(down, Fp8Weight)
            return self._with_fp8_shared(gate_up, down, inner)
        if not isinstance(self.gate_up, torch.Tensor) or not isinstance(self.down, torch.Tensor):
            raise ValueError(
                f"shared experts beside {type(self.gate_up).__name__} routed experts are not "
                "supported (dense and FP8 stacks are)"
            )
        dtype = self.gate_up.dtype
        gate_up = _dense(gate_up, dtype)
        down = _dense(down, dtype)
        count = down.shape[1] // inner
        assert self.gate_up_bias is None and down.shape[1] == count * inner
        gate, up = gate_up.view(2, count, inner, -1).unbind(0)
        stacked_up = torch.cat((gate, up), dim=1)  # [count, 2I, H]
        stacked_down = down.view(down.shape[0], count, inner).transpose(0, 1)  # [count, H, I]
        return self._extended(
            torch.cat((self.gate_up, stacked_up)).contiguous(),
            torch.cat((self.down, stacked_down)).contiguous(),
            count,
        )

    def _with_fp8_shared(self, gate_up: Fp8Weight, down: Fp8Weight, inner: int) -> ExpertWeights:
        assert isinstance(self.gate_up, Fp8Experts) and isinstance(self.down, Fp8Experts)
        shared = down.w.shape[1]
        count = shared // inner
        assert self.gate_up_bias is None and shared == count * inner
        ups = [
            cat_fp8(
                [
                    slice_fp8(gate_up, 0, c * inner, inner),
                    slice_fp8(gate_up, 0, shared + c * inner, inner),
                ]
            )
            for c in range(count)
        ]
        downs = [slice_fp8(down, 1, c * inner, inner) for c in range(count)]
        return self._extended(
            stack_fp8(unstack_fp8(self.gate_up) + ups),
            stack_fp8(unstack_fp8(self.down) + downs),
            count,
        )

    def _extended(self, gate_up: Experts, down: Experts, count: int) -> ExpertWeights:
        return ExpertWeights(
            self.router, self.router_bias, gate_up, None, down, None, self.score_bias,
            self.shared + count, self.hash_table,
        )  # fmt: skip


class MoE:
    """`fp32_router`: router logits in float32 (DeepSeek computes them so), else in the
    weights' dtype (Qwen3-MoE, gpt-oss). `limit`: the clamp of a clamped activation (default
    the config's `swiglu_limit`). `fused_router` (class-wide, for A/B runs): at 1..16 tokens
    the router linear and the top-k run as one kernel (`fused_router_topk`; hash-routed
    layers and larger steps keep the linear + `router_topk`). Off until a GPU has run its
    cross-program hand-off and timed it (docs/benchmarks.md, "The MoE router, fused")."""

    fused_router = False

    def __init__(
        self,
        moe: MoeConfig,
        weights: ExpertWeights,
        act: Activation,
        gemv_max_pairs: int = 64,
        fp32_router: bool = False,
        limit: float | None = None,
    ) -> None:
        self.moe, self.w, self.act = moe, weights, act
        self.gemv_max_pairs = gemv_max_pairs
        self.router = (weights.router.float() if fp32_router else weights.router).contiguous()
        self.per_token = moe.top_k + weights.shared  # pairs per token
        # the fused router's counter of finished programs (0 between launches), this layer's own
        self.ticket = torch.zeros(1, dtype=torch.int32, device=weights.router.device)
        if limit is None:
            limit = moe.swiglu_limit if moe.swiglu_limit is not None else 0.0
        self.limit = limit

    def route(
        self, x: torch.Tensor, ids: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(weights fp32 [T, k + shared], experts int32 [T, k + shared]): one linear, one
        top-k kernel, or both in one (`fused_router`); a hash-routed layer reads its experts
        from the token `ids` [T]."""
        table = self.w.hash_table
        if table is not None and ids is None:
            raise ValueError("a hash-routed MoE layer needs the step's token ids")
        if (
            self.fused_router
            and table is None
            and 0 < x.shape[0] <= FUSED_MAX_TOKENS
            and x.stride(1) == 1
        ):
            return fused_router_topk(x, self.router, self.w.router_bias, self.moe, self.ticket,
                                     self.w.score_bias, self.w.shared)  # fmt: skip
        logits = F.linear(x.to(self.router.dtype), self.router, self.w.router_bias)
        return router_topk(logits, self.moe, self.w.score_bias, self.w.shared, table,
                           ids if table is not None else None)  # fmt: skip

    def _activate(self, gate_up: torch.Tensor) -> torch.Tensor:
        return gated_activation(gate_up, self.act, alpha=self.moe.swiglu_alpha, limit=self.limit)

    def __call__(self, x: torch.Tensor, ids: torch.Tensor | None = None) -> torch.Tensor:
        weight, expert = self.route(x, ids)
        if x.shape[0] * self.per_token <= self.gemv_max_pairs:
            return self._gemv(x, weight, expert)
        return self._grouped(x, weight, expert)

    def _gemv(self, x: torch.Tensor, weight: torch.Tensor, expert: torch.Tensor) -> torch.Tensor:
        k, w = self.per_token, self.w
        experts = expert.flatten()
        act = _gate_up_kernel(w.gate_up)(
            x,
            w.gate_up,
            experts,
            act=self.act,
            bias=w.gate_up_bias,
            row_div=k,
            alpha=self.moe.swiglu_alpha,
            limit=self.limit,
            tiles=self._tiles("gate_up", w.gate_up),
        )
        down_tiles = self._tiles("down", w.down)
        return _down_kernel(w.down)(
            act, w.down, experts, weight.flatten(), k, bias=w.down_bias, tiles=down_tiles
        )

    def _tiles(self, kernel: str, w: Experts) -> GemvTiles:
        """The tuned launch shape for this layer's shape (looked up at call time, so a sweep's
        file loaded after the build still applies; a graph captures the choice)."""
        _, n, k = expert_shape(w)
        return _gemv_tiles(tiles_for(kernel, n, k, self.per_token, format_name(w)), w)

    def _grouped(self, x: torch.Tensor, weight: torch.Tensor, expert: torch.Tensor) -> torch.Tensor:
        k, w = self.per_token, self.w
        pairs = x.shape[0] * k
        experts, two_inner, _ = expert_shape(w.gate_up)
        aligned = align_pairs(expert.flatten(), experts, 16 if pairs <= 1024 else 64)
        gate_up = torch.empty((pairs, two_inner), dtype=x.dtype, device=x.device)
        _grouped_gemm(
            x, w.gate_up, aligned, num_pairs=pairs, row_div=k, out=gate_up, bias=w.gate_up_bias
        )
        act = self._activate(gate_up)
        out = torch.empty((pairs, x.shape[1]), dtype=torch.float32, device=x.device)
        _grouped_gemm(
            act,
            w.down,
            aligned,
            num_pairs=pairs,
            row_div=1,
            out=out,
            bias=w.down_bias,
            scale=weight.flatten(),
        )
        return out.view(x.shape[0], k, -1).sum(1).to(x.dtype)
