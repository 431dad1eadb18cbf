"""Mixture of experts as a layer: router, then the experts through one of two graph-safe
paths with the same result (no host sync in either, so decode CUDA graphs cover every batch).

- Router: softmax or sigmoid scores over a (biased) linear, top-k, optional renormalization.
- Few pairs (`pairs <= gemv_max_pairs`): the expert GEMV (`kernels/moe_gemv.py`), each pair
  reading its expert in place; the down projection accumulates the weighted combine.
- Otherwise: pairs sorted by expert on the device and the fused grouped GEMM
  (`kernels/moe_grouped.py`), one launch per projection, then a sum over each token's k rows.

Experts are stacked `gate_up` [E, 2I, H] (gate rows first, then up) and `down` [E, H, I], with
optional biases [E, 2I] / [E, H]; the activation is SiLU-gated or gpt-oss's clamped SwiGLU.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from resin_models_cuda.kernels.activation import Activation, gated_activation
from resin_models_cuda.kernels.moe_gemv import expert_gemv
from resin_models_cuda.kernels.moe_grouped import align_pairs, grouped_gemm
from resin_models_cuda.kernels.router import router_topk
from resin_models_torch.config import MoeConfig


@dataclass(frozen=True, slots=True)
class ExpertWeights:
    router: torch.Tensor  # [E, H]
    router_bias: torch.Tensor | None  # [E]
    gate_up: torch.Tensor  # [E, 2I, H]
    gate_up_bias: torch.Tensor | None  # [E, 2I]
    down: torch.Tensor  # [E, H, I]
    down_bias: torch.Tensor | None  # [E, H]


class MoE:
    def __init__(
        self, moe: MoeConfig, weights: ExpertWeights, act: Activation, gemv_max_pairs: int = 64
    ) -> None:
        self.moe, self.w, self.act = moe, weights, act
        self.gemv_max_pairs = gemv_max_pairs

    def route(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(weights fp32 [T, k], experts int32 [T, k]): one linear, one top-k kernel."""
        logits = F.linear(x, self.w.router, self.w.router_bias)
        return router_topk(
            logits,
            self.moe.top_k,
            sigmoid=self.moe.scoring == "sigmoid",
            renormalize=self.moe.norm_topk_prob,
        )

    def _activate(self, gate_up: torch.Tensor) -> torch.Tensor:
        limit = self.moe.swiglu_limit
        return gated_activation(
            gate_up,
            self.act,
            alpha=self.moe.swiglu_alpha,
            limit=limit if limit is not None else 0.0,
        )

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        weight, expert = self.route(x)
        if x.shape[0] * self.moe.top_k <= self.gemv_max_pairs:
            return self._gemv(x, weight, expert)
        return self._grouped(x, weight, expert)

    def _gemv(self, x: torch.Tensor, weight: torch.Tensor, expert: torch.Tensor) -> torch.Tensor:
        k, w = self.moe.top_k, self.w
        pairs = x.shape[0] * k
        experts = expert.flatten()
        gate_up = torch.empty((pairs, w.gate_up.shape[1]), dtype=x.dtype, device=x.device)
        expert_gemv(x, w.gate_up, experts, out=gate_up, bias=w.gate_up_bias, row_div=k)
        act = self._activate(gate_up)
        out = torch.zeros((x.shape[0], x.shape[1]), dtype=torch.float32, device=x.device)
        expert_gemv(act, w.down, experts, out=out, scale=weight.flatten(), topk=k, bias=w.down_bias)
        return out.to(x.dtype)

    def _grouped(self, x: torch.Tensor, weight: torch.Tensor, expert: torch.Tensor) -> torch.Tensor:
        k, w = self.moe.top_k, self.w
        pairs = x.shape[0] * k
        aligned = align_pairs(expert.flatten(), self.moe.num_experts, 16 if pairs <= 1024 else 64)
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
