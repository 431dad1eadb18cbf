"""DeepSeek V2 / V2-Lite / V3 on the fast layer library: multi-head latent attention over the
latent cache (`layers/mla.py`: absorbed decode, expanded prefill), dense first
`first_k_dense_replace` layers, then the library MoE with DeepSeek's grouped routing (softmax or
sigmoid scores, V3's correction bias, `routed_scaling_factor`: the router kernel) and the shared
experts folded into the expert stack as always-chosen experts. MTP layers
in the checkpoint are not loaded here (the reference runner's `MtpRunner` drafts with them)."""

from __future__ import annotations

from dataclasses import replace

import torch

from resin_model.config import ModelConfig
from resin_models_cuda.layers import GatedMLP, MoE, RMSNorm, Rotary, WeightSource
from resin_models_cuda.layers import activation_of as activation
from resin_models_cuda.layers.mla import MlaAttention, prefill_rows
from resin_models_cuda.models.base import BuildOptions, FastModel
from resin_models_cuda.models.llama import qwen_experts
from resin_models_cuda.step import StepTensors


class DeepseekLayer:
    def __init__(self, model: Deepseek, i: int, w: WeightSource) -> None:
        c, p = model.config, f"model.layers.{i}."
        h = c.hidden_size
        self.input_norm = RMSNorm(w, f"{p}input_layernorm.weight", h, c.norm_eps)
        self.attn = MlaAttention(c, w, f"{p}self_attn.", model.slots[i], model.rope)
        self.post_norm = RMSNorm(w, f"{p}post_attention_layernorm.weight", h, c.norm_eps)
        self.mlp = model.make_mlp(w, i)


class Deepseek(FastModel):
    def __init__(self, config: ModelConfig, w: WeightSource, options: BuildOptions) -> None:
        if config.mla is None or config.moe is None:
            raise ValueError("deepseek models need MLA and MoE configs")
        super().__init__(config, w, options)
        self.mla = config.mla
        max_pos = min(options.max_positions, config.max_positions) + 1
        self.rope = Rotary(config.rope, config.mla.rope_dim, max_pos, self.device)
        self.layers = [DeepseekLayer(self, i, w) for i in range(config.num_layers)]

    def cache_token_shape(self) -> tuple[int, int, int]:
        return 1, 1, self.mla.latent_dim  # one latent per token per layer

    def make_mlp(self, w: WeightSource, i: int) -> GatedMLP | MoE:
        c, p = self.config, f"model.layers.{i}.mlp."
        if not c.is_sparse(i):
            return GatedMLP(w, p, c.hidden_size, c.intermediate_size, c.hidden_act)
        moe = c.moe
        assert moe is not None
        experts = qwen_experts(c, w, p)
        if moe.score_bias:
            bias = w.get(f"{p}gate.e_score_correction_bias", (moe.num_experts,), "zeros")
            experts = replace(experts, score_bias=bias.float())
        if moe.shared_intermediate_size:  # n_shared_experts x the expert width, by definition
            inner = moe.shared_intermediate_size
            shared = GatedMLP(w, f"{p}shared_experts.", c.hidden_size, inner, c.hidden_act)
            experts = experts.with_shared(shared.gate_up, shared.down)
        act, pairs = activation(c.hidden_act), self.options.moe_gemv_max_pairs
        return MoE(moe, experts, act, pairs, fp32_router=True)

    def forward(self, step: StepTensors, kv: torch.Tensor) -> torch.Tensor:
        rows = prefill_rows(step)
        residual = self.embed_tokens(step.input_ids)
        x = self.layers[0].input_norm(residual)
        for i, layer in enumerate(self.layers):
            if i > 0:
                layer.input_norm.add_norm(x, residual)
            x = layer.attn(x, step, kv, rows)
            layer.post_norm.add_norm(x, residual)
            x = layer.mlp(x)
        self.final_norm.add_norm(x, residual)
        return x
