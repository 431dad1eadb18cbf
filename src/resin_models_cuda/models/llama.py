"""Llama family on the fast layer library: Llama 2/3 (Llama-3 rope scaling), Mistral (sliding
window), Qwen2/2.5 (q/k/v bias), Qwen3 (per-head q/k norm), SmolLM2 (tied embeddings), and
Qwen3-MoE (the same layer with a routed MoE on its sparse layers). Pre-norm: every norm fuses
the residual add before it."""

from __future__ import annotations

from typing import Generic, TypeVar

import torch

from resin_model.config import ModelConfig
from resin_models_cuda.layers import (
    ExpertWeights,
    GatedMLP,
    MoE,
    RMSNorm,
    WeightSource,
    activation_of,
)
from resin_models_cuda.layers.quantized import stacked_experts
from resin_models_cuda.models.base import BuildOptions, FastModel
from resin_models_cuda.step import StepTensors


def qwen_experts(config: ModelConfig, weights: WeightSource, prefix: str) -> ExpertWeights:
    """Qwen3-MoE names: `mlp.gate` router; experts per expert as checkpoints store them
    (`mlp.experts.{j}.{gate,up,down}_proj`, FP8 where stored so) or fused as transformers 5
    holds them in memory (`mlp.experts.gate_up_proj` [E, 2I, H], `mlp.experts.down_proj`
    [E, H, I])."""
    assert config.moe is not None
    hidden, inner = config.hidden_size, config.moe.intermediate_size
    experts = config.moe.num_experts
    router = weights.get(f"{prefix}gate.weight", (experts, hidden))
    if weights.has(f"{prefix}experts.gate_up_proj"):
        fused_up = weights.get(f"{prefix}experts.gate_up_proj", (experts, 2 * inner, hidden))
        fused_down = weights.get(f"{prefix}experts.down_proj", (experts, hidden, inner), "out")
        return ExpertWeights(router, None, fused_up, None, fused_down, None)

    def names(j: int, parts: tuple[str, ...]) -> list[str]:
        return [f"{prefix}experts.{j}.{part}.weight" for part in parts]

    gate_up = stacked_experts(
        weights, [names(j, ("gate_proj", "up_proj")) for j in range(experts)],
        [(inner, hidden), (inner, hidden)],
    )  # fmt: skip
    down_names = [names(j, ("down_proj",)) for j in range(experts)]
    down = stacked_experts(weights, down_names, [(hidden, inner)], "out")
    return ExpertWeights(router, None, gate_up, None, down, None)


AttentionT = TypeVar("AttentionT")


class LlamaLayer(Generic[AttentionT]):
    """A pre-norm decoder layer (norm, attention, norm, MLP): Llama's with `Attention`,
    DeepSeek's with `MlaAttention`; the model calls the parts."""

    def __init__(
        self,
        config: ModelConfig,
        weights: WeightSource,
        prefix: str,
        attention: AttentionT,
        mlp: GatedMLP | MoE,
    ) -> None:
        hidden, eps = config.hidden_size, config.norm_eps
        self.input_norm = RMSNorm(weights, f"{prefix}input_layernorm.weight", hidden, eps)
        self.attn = attention
        self.post_norm = RMSNorm(weights, f"{prefix}post_attention_layernorm.weight", hidden, eps)
        self.mlp = mlp


class Llama(FastModel):
    def __init__(self, config: ModelConfig, weights: WeightSource, options: BuildOptions) -> None:
        super().__init__(config, weights, options)
        self.layers = [
            LlamaLayer(
                config,
                weights,
                f"model.layers.{layer}.",
                self.attention(weights, layer),
                self.make_mlp(weights, layer),
            )
            for layer in range(config.num_layers)
        ]

    def make_mlp(self, weights: WeightSource, layer: int) -> GatedMLP | MoE:
        config, prefix = self.config, f"model.layers.{layer}.mlp."
        if config.is_sparse(layer):
            assert config.moe is not None
            return MoE(
                config.moe,
                qwen_experts(config, weights, prefix),
                activation_of(config.hidden_act),
                self.options.moe_gemv_max_pairs,
            )
        hidden, inner = config.hidden_size, config.intermediate_size
        return GatedMLP(weights, prefix, hidden, inner, config.hidden_act, config.mlp_bias)

    def forward(self, step: StepTensors, kv: torch.Tensor) -> torch.Tensor:
        residual = self.embed_tokens(step.input_ids)
        x = self.layers[0].input_norm(residual)
        for index, layer in enumerate(self.layers):
            if index > 0:
                x, residual = layer.input_norm(x, residual)
            x = layer.attn(x, step, kv)
            x, residual = layer.post_norm(x, residual)
            x = layer.mlp(x)
        x, residual = self.final_norm(x, residual)
        return x
