"""Qwen3-MoE sparse MLP: softmax router, top-k experts, renormalized weights.

Two paths with the same result. Small batches (at most `GEMV_MAX_PAIRS` token-expert pairs)
use the Triton expert GEMV (`kernels/moe_gemv.py`): no host sync, CUDA-graph safe, each pair
reads only its expert's weights. Larger batches sort the pairs by expert and run one cuBLAS
GEMM per active expert (it reads each active expert once, but needs the per-expert counts on
the host, so it is not captured in graphs). A Triton grouped GEMM over sorted tokens would
serve both; it is future work (docs/gpu.md).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from resin_models_cuda.config import ModelConfig
from resin_models_cuda.kernels import silu_and_mul
from resin_models_cuda.kernels.moe_gemv import expert_gemv
from resin_models_cuda.weights import LayerWeights

GEMV_MAX_PAIRS = 256


def route(
    config: ModelConfig, layer: LayerWeights, h: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """(weights fp32 [T, k], experts int64 [T, k]) of every token."""
    assert layer.router is not None
    probs = torch.softmax(F.linear(h, layer.router).float(), dim=-1)
    weight, expert = probs.topk(config.experts_per_token, dim=-1)
    if config.norm_topk_prob:
        weight = weight / weight.sum(-1, keepdim=True)
    return weight, expert


def moe_forward(config: ModelConfig, layer: LayerWeights, h: torch.Tensor) -> torch.Tensor:
    if h.shape[0] * config.experts_per_token <= GEMV_MAX_PAIRS:
        return moe_forward_gemv(config, layer, h)
    return moe_forward_sorted(config, layer, h)


def moe_forward_gemv(config: ModelConfig, layer: LayerWeights, h: torch.Tensor) -> torch.Tensor:
    weight, expert = route(config, layer, h)
    k = config.experts_per_token
    pairs = h.shape[0] * k
    experts = expert.flatten()
    rows = torch.arange(pairs, device=h.device) // k
    gate_up = torch.empty((pairs, layer.gate_up.shape[1]), dtype=h.dtype, device=h.device)
    expert_gemv(h, layer.gate_up, rows, experts, out=gate_up)
    act = silu_and_mul(gate_up)
    out = torch.zeros((h.shape[0], h.shape[1]), dtype=torch.float32, device=h.device)
    pair_ids = torch.arange(pairs, device=h.device)
    expert_gemv(act, layer.down, pair_ids, experts, out=out, scale=weight.flatten(), topk=k)
    return out.to(h.dtype)


def moe_forward_sorted(config: ModelConfig, layer: LayerWeights, h: torch.Tensor) -> torch.Tensor:
    weight, expert = route(config, layer, h)
    flat_expert = expert.flatten()
    order = flat_expert.argsort()
    token_of = order // config.experts_per_token
    counts = torch.bincount(flat_expert, minlength=config.num_experts).tolist()
    out = torch.zeros_like(h, dtype=torch.float32)
    start = 0
    for e, n in enumerate(counts):
        if n == 0:
            continue
        idx = token_of[start : start + n]
        y = F.linear(silu_and_mul(F.linear(h[idx], layer.gate_up[e])), layer.down[e])
        w = weight.flatten()[order[start : start + n]]
        out.index_add_(0, idx, y.float() * w[:, None])
        start += n
    return out.to(h.dtype)
