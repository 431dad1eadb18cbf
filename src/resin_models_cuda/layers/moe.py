"""Mixture of experts as a layer: router, then the experts through one of two graph-safe
paths with the same result (no host sync in either, so decode CUDA graphs cover every batch).

- Router: softmax or sigmoid scores over a (biased) linear, optional group-limited choice and
  score bias (DeepSeek), top-k, optional renormalization and scale, in one kernel; shared
  experts ride along as always-chosen experts of weight 1 (`ExpertWeights.with_shared`).
- Few pairs (`pairs <= gemv_max_pairs`): the expert GEMV (`kernels/moe_gemv.py`), each pair
  reading its expert in place: gate_up with the activation fused, then down adding each
  weighted pair into a zeroed float32 sum (and a cast).
- Otherwise: pairs sorted by expert on the device and the fused grouped GEMM
  (`kernels/moe_grouped.py`), one launch per projection, then a sum over each token's k rows.

Experts are stacked `gate_up` [E, 2I, H] (gate rows first, then up) and `down` [E, H, I], with
optional biases [E, 2I] / [E, H]; the activation is SiLU-gated or gpt-oss's clamped SwiGLU.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from resin_model.config import MoeConfig
from resin_models_cuda.kernels.activation import Activation, gated_activation
from resin_models_cuda.kernels.moe_gemv import GemvTiles, expert_down, expert_gate_up, tiles_for
from resin_models_cuda.kernels.moe_grouped import align_pairs, grouped_gemm
from resin_models_cuda.kernels.router import router_topk


@dataclass(frozen=True, slots=True)
class ExpertWeights:
    """Stacked experts; `shared` trailing experts of `gate_up` / `down` (none of the router's
    rows) run for every token with weight 1 (DeepSeek's shared experts, see `with_shared`)."""

    router: torch.Tensor  # [E, H]
    router_bias: torch.Tensor | None  # [E]
    gate_up: torch.Tensor  # [E + shared, 2I, H]
    gate_up_bias: torch.Tensor | None  # [E + shared, 2I]
    down: torch.Tensor  # [E + shared, H, I]
    down_bias: torch.Tensor | None  # [E + shared, H]
    score_bias: torch.Tensor | None = None  # fp32 [E]: steers the choice, not the weights
    shared: int = 0

    def with_shared(self, gate_up: torch.Tensor, down: torch.Tensor) -> ExpertWeights:
        """Append a dense gated MLP (`gate_up` [2S, H] as [gate; up], `down` [H, S], S a
        multiple of the expert width I) as S / I always-on experts: an MLP is a sum over
        its inner dimension, so its slices of width I are experts of weight 1."""
        inner = self.down.shape[2]
        count = down.shape[1] // inner
        assert self.gate_up_bias is None and down.shape[1] == count * inner
        gate, up = gate_up.view(2, count, inner, -1).unbind(0)
        stacked_up = torch.cat((gate, up), dim=1)  # [count, 2I, H]
        stacked_down = down.view(down.shape[0], count, inner).transpose(0, 1)  # [count, H, I]
        return ExpertWeights(
            self.router,
            self.router_bias,
            torch.cat((self.gate_up, stacked_up)).contiguous(),
            None,
            torch.cat((self.down, stacked_down)).contiguous(),
            None,
            self.score_bias,
            self.shared + count,
        )


class MoE:
    """`fp32_router`: router logits in float32 (DeepSeek computes them so), else in the
    weights' dtype (Qwen3-MoE, gpt-oss)."""

    def __init__(
        self,
        moe: MoeConfig,
        weights: ExpertWeights,
        act: Activation,
        gemv_max_pairs: int = 64,
        fp32_router: bool = False,
    ) -> None:
        self.moe, self.w, self.act = moe, weights, act
        self.gemv_max_pairs = gemv_max_pairs
        self.router = weights.router.float() if fp32_router else weights.router
        self.per_token = moe.top_k + weights.shared  # pairs per token
        self.limit = moe.swiglu_limit if moe.swiglu_limit is not None else 0.0  # clamped SwiGLU

    def route(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(weights fp32 [T, k + shared], experts int32 [T, k + shared]): one linear, one
        top-k kernel."""
        logits = F.linear(x.to(self.router.dtype), self.router, self.w.router_bias)
        return router_topk(logits, self.moe, self.w.score_bias, self.w.shared)

    def _activate(self, gate_up: torch.Tensor) -> torch.Tensor:
        return gated_activation(gate_up, self.act, alpha=self.moe.swiglu_alpha, limit=self.limit)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        weight, expert = self.route(x)
        if x.shape[0] * self.per_token <= self.gemv_max_pairs:
            return self._gemv(x, weight, expert)
        return self._grouped(x, weight, expert)

    def _gemv(self, x: torch.Tensor, weight: torch.Tensor, expert: torch.Tensor) -> torch.Tensor:
        k, w = self.per_token, self.w
        experts = expert.flatten()
        act = expert_gate_up(
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
        return expert_down(
            act, w.down, experts, weight.flatten(), k, bias=w.down_bias, tiles=down_tiles
        )

    def _tiles(self, kernel: str, w: torch.Tensor) -> GemvTiles:
        """The tuned launch shape for this layer's shape (looked up at call time, so a sweep's
        file loaded after the build still applies; a graph captures the choice)."""
        return tiles_for(kernel, w.shape[1], w.shape[2], self.per_token)

    def _grouped(self, x: torch.Tensor, weight: torch.Tensor, expert: torch.Tensor) -> torch.Tensor:
        k, w = self.per_token, self.w
        pairs = x.shape[0] * k
        aligned = align_pairs(expert.flatten(), w.gate_up.shape[0], 16 if pairs <= 1024 else 64)
        gate_up = torch.empty((pairs, w.gate_up.shape[1]), dtype=x.dtype, device=x.device)
        grouped_gemm(
            x, w.gate_up, aligned, num_pairs=pairs, row_div=k, out=gate_up, bias=w.gate_up_bias
        )
        act = self._activate(gate_up)
        out = torch.empty((pairs, x.shape[1]), dtype=torch.float32, device=x.device)
        grouped_gemm(
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
