"""Qwen3-MoE MLP: the Triton expert-GEMV path equals the sorted cuBLAS path and a per-token
loop in plain PyTorch."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
import torch.nn.functional as F

from resin_models_cuda.config import preset


@pytest.mark.parametrize("tokens", [1, 3, 7])
def test_moe_paths_agree(device: str, tokens: int) -> None:
    from resin_models_cuda.moe import moe_forward_gemv, moe_forward_sorted, route
    from resin_models_cuda.weights import random_weights

    config = replace(
        preset("tiny"), model_type="qwen3_moe", qk_norm=True, num_experts=6,
        experts_per_token=2, moe_intermediate_size=40, num_layers=1,
    )  # fmt: skip
    dtype = torch.float32 if device == "cpu" else torch.bfloat16
    layer = random_weights(config, device, dtype, seed=3, std=0.2).layers[0]
    h = torch.randn((tokens, config.hidden_size)).to(dtype).to(device)
    weight, expert = route(config, layer, h)
    expect = torch.zeros((tokens, config.hidden_size), device=device)
    for t in range(tokens):
        for j in range(config.experts_per_token):
            e = int(expert[t, j])
            gate, up = F.linear(h[t].float(), layer.gate_up[e].float()).chunk(2)
            y = F.linear(F.silu(gate) * up, layer.down[e].float())
            expect[t] += weight[t, j] * y
    tol = 1e-4 if device == "cpu" else 3e-2
    torch.testing.assert_close(
        moe_forward_gemv(config, layer, h).float(), expect, atol=tol, rtol=tol
    )
    torch.testing.assert_close(
        moe_forward_sorted(config, layer, h).float(), expect, atol=tol, rtol=tol
    )
