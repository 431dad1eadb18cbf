"""Llama family on the fast layer library: Llama 2/3 (Llama-3 rope scaling), Mistral (sliding
window), Qwen2/2.5 (q/k/v bias), Qwen3 (per-head q/k norm), SmolLM2 (tied embeddings), and
Qwen3-MoE (the same layer with a routed MoE on its sparse layers). Pre-norm: every norm fuses
the residual add before it."""

from __future__ import annotations

import torch

from resin_model.config import ModelConfig
from resin_models_cuda.layers import (
    Attention,
    ExpertWeights,
    GatedMLP,
    MoE,
    RMSNorm,
    WeightSource,
    activation_of,
)
from resin_models_cuda.models.base import BuildOptions, FastModel
from resin_models_cuda.step import StepTensors


def qwen_experts(c: ModelConfig, w: WeightSource, p: str) -> ExpertWeights:
    """Qwen3-MoE names: `mlp.gate` router; experts per expert as checkpoints store them
    (`mlp.experts.{j}.{gate,up,down}_proj`) or fused as transformers 5 holds them in memory
    (`mlp.experts.gate_up_proj` [E, 2I, H], `mlp.experts.down_proj` [E, H, I])."""
    assert c.moe is not None
    h, i, e = c.hidden_size, c.moe.intermediate_size, c.moe.num_experts
    router = w.get(f"{p}gate.weight", (e, h))
    if w.has(f"{p}experts.gate_up_proj"):
        gate_up = w.get(f"{p}experts.gate_up_proj", (e, 2 * i, h))
        down = w.get(f"{p}experts.down_proj", (e, h, i), "out")
        return ExpertWeights(router, None, gate_up, None, down, None)
    gate_up = torch.stack(
        [
            torch.cat(
                [
                    w.get(f"{p}experts.{j}.gate_proj.weight", (i, h)),
                    w.get(f"{p}experts.{j}.up_proj.weight", (i, h)),
                ]
            )
            for j in range(e)
        ]
    )
    down = torch.stack([w.get(f"{p}experts.{j}.down_proj.weight", (h, i), "out") for j in range(e)])
    return ExpertWeights(router, None, gate_up, None, down, None)


class LlamaLayer:
    def __init__(self, model: Llama, i: int, w: WeightSource) -> None:
        c, p = model.config, f"model.layers.{i}."
        h = c.hidden_size
        self.input_norm = RMSNorm(w, f"{p}input_layernorm.weight", h, c.norm_eps)
        self.attn = Attention(
            c, w, f"{p}self_attn.", model.slots[i], model.window(i), model.rotary(i)
        )
        self.post_norm = RMSNorm(w, f"{p}post_attention_layernorm.weight", h, c.norm_eps)
        self.mlp = model.make_mlp(w, i)


class Llama(FastModel):
    def __init__(self, config: ModelConfig, w: WeightSource, options: BuildOptions) -> None:
        super().__init__(config, w, options)
        self.layers = [LlamaLayer(self, i, w) for i in range(config.num_layers)]

    def make_mlp(self, w: WeightSource, i: int) -> GatedMLP | MoE:
        c, p = self.config, f"model.layers.{i}.mlp."
        if c.is_sparse(i):
            assert c.moe is not None
            return MoE(
                c.moe,
                qwen_experts(c, w, p),
                activation_of(c.hidden_act),
                self.options.moe_gemv_max_pairs,
            )
        return GatedMLP(w, p, c.hidden_size, c.intermediate_size, c.hidden_act, c.mlp_bias)

    def forward(self, step: StepTensors, kv: torch.Tensor) -> torch.Tensor:
        residual = self.embed_tokens(step.input_ids)
        x = self.layers[0].input_norm(residual)
        for i, layer in enumerate(self.layers):
            if i > 0:
                layer.input_norm.add_norm(x, residual)
            x = layer.attn(x, step, kv)
            layer.post_norm.add_norm(x, residual)
            x = layer.mlp(x)
        self.final_norm.add_norm(x, residual)
        return x
