"""Qwen3-MoE sparse MLP: softmax router, top-k experts, renormalized weights.

Reference path in PyTorch (sorted tokens, one GEMM per active expert); a grouped-GEMM Triton
kernel is future work (see docs/gpu.md).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from resin_models_cuda.config import ModelConfig
from resin_models_cuda.kernels import silu_and_mul
from resin_models_cuda.weights import LayerWeights


def moe_forward(config: ModelConfig, layer: LayerWeights, h: torch.Tensor) -> torch.Tensor:
    assert layer.router is not None
    probs = torch.softmax(F.linear(h, layer.router).float(), dim=-1)
    weight, expert = probs.topk(config.experts_per_token, dim=-1)
    if config.norm_topk_prob:
        weight = weight / weight.sum(-1, keepdim=True)
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
