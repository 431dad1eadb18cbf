"""DeepSeek V2 / V2-Lite / V3 on the fast layer library: multi-head latent attention over the
latent cache (`layers/mla.py`: absorbed decode, expanded prefill), dense first
`first_k_dense_replace` layers, then the library MoE with DeepSeek's grouped routing (softmax or
sigmoid scores, V3's correction bias, `routed_scaling_factor`: the router kernel) and the shared
experts folded into the expert stack as always-chosen experts (FP8 stacks stay FP8), the
router weight and correction bias read in float32. MTP layers
in the checkpoint are not loaded here (the reference runner's `MtpRunner` drafts with them)."""

from __future__ import annotations

from dataclasses import replace

import torch

from resin_model.config import ModelConfig
from resin_models_cuda.layers import GatedMLP, MoE, Rotary, WeightSource
from resin_models_cuda.layers import activation_of as activation
from resin_models_cuda.layers.mla import MlaAttention, prefill_rows
from resin_models_cuda.layers.quantized import float32_tensor
from resin_models_cuda.models.base import BuildOptions, FastModel
from resin_models_cuda.models.llama import LlamaLayer, qwen_experts
from resin_models_cuda.step import StepTensors


def deepseek_moe(
    config: ModelConfig, weights: WeightSource, prefix: str, options: BuildOptions
) -> MoE:
    """DeepSeek-V2/V3's MoE at `prefix` (`...mlp.`): routed experts, the router and V3's
    correction bias in float32 (as transformers keeps them: read without rounding to the
    model's dtype where the source can), the shared experts folded in as always-chosen
    experts. GLM-4.5 builds its MoE here as well."""
    moe = config.moe
    assert moe is not None
    hidden = config.hidden_size
    experts = qwen_experts(config, weights, prefix)
    router = float32_tensor(weights, f"{prefix}gate.weight", (moe.num_experts, hidden))
    experts = replace(experts, router=router)
    if moe.score_bias:
        name = f"{prefix}gate.e_score_correction_bias"
        bias = float32_tensor(weights, name, (moe.num_experts,), "zeros")
        experts = replace(experts, score_bias=bias)
    if moe.shared_intermediate_size:  # n_shared_experts x the expert width, by definition
        inner = moe.shared_intermediate_size
        name = f"{prefix}shared_experts."
        shared = GatedMLP(weights, name, hidden, inner, config.hidden_act)
        experts = experts.with_shared(shared.gate_up.weight, shared.down.weight)
    pairs = options.moe_gemv_max_pairs
    return MoE(moe, experts, activation(config.hidden_act), pairs, fp32_router=True)


class Deepseek(FastModel):
    def __init__(self, config: ModelConfig, weights: WeightSource, options: BuildOptions) -> None:
        if config.mla is None or config.moe is None:
            raise ValueError("deepseek models need MLA and MoE configs")
        super().__init__(config, weights, options)
        self.mla = config.mla
        positions = min(options.max_positions, config.max_positions) + 1
        self.rope = Rotary(config.rope, config.mla.rope_dim, positions, self.device)
        self.layers = [
            LlamaLayer(
                config,
                weights,
                f"model.layers.{layer}.",
                MlaAttention(
                    config,
                    weights,
                    f"model.layers.{layer}.self_attn.",
                    self.slots[layer],
                    self.rope,
                ),
                self.make_mlp(weights, layer),
            )
            for layer in range(config.num_layers)
        ]

    def cache_token_shape(self) -> tuple[int, int, int]:
        return 1, 1, self.mla.latent_dim  # one latent per token per layer

    def make_mlp(self, weights: WeightSource, layer: int) -> GatedMLP | MoE:
        config, prefix = self.config, f"model.layers.{layer}.mlp."
        if not config.is_sparse(layer):
            hidden, inner = config.hidden_size, config.intermediate_size
            return GatedMLP(weights, prefix, hidden, inner, config.hidden_act)
        return deepseek_moe(config, weights, prefix, self.options)

    def forward(self, step: StepTensors, kv: torch.Tensor) -> torch.Tensor:
        rows = prefill_rows(step)
        residual = self.embed_tokens(step.input_ids)
        x = self.layers[0].input_norm(residual)
        for index, layer in enumerate(self.layers):
            if index > 0:
                x, residual = layer.input_norm(x, residual)
            x = layer.attn(x, step, kv, rows)
            x, residual = layer.post_norm(x, residual)
            x = layer.mlp(x)
        x, residual = self.final_norm(x, residual)
        return x
