"""OLMo 2 on the fast layer library: the Llama layer with the norms moved after each sublayer
(the sublayer's output is normed before it joins the residual; no pre-norms, so each sublayer
reads the residual stream itself) and q/k RMS norms over the whole projection width (all heads
at once, `qk_norm_per_head = False`, applied by `Attention`) before rotary. The boundaries are
plain adds: `x += post_norm(sublayer(x))`, the norm in place on the sublayer's output."""

from __future__ import annotations

import torch

from resin_model.config import ModelConfig
from resin_models_cuda.layers import Attention, GatedMLP, RMSNorm, WeightSource
from resin_models_cuda.models.base import BuildOptions, FastModel
from resin_models_cuda.step import StepTensors


class Olmo2Layer:
    def __init__(
        self, config: ModelConfig, weights: WeightSource, prefix: str, attention: Attention
    ) -> None:
        hidden, inner, eps = config.hidden_size, config.intermediate_size, config.norm_eps
        self.attn = attention
        self.post_attn_norm = RMSNorm(
            weights, f"{prefix}post_attention_layernorm.weight", hidden, eps
        )
        self.mlp = GatedMLP(
            weights, f"{prefix}mlp.", hidden, inner, config.hidden_act, config.mlp_bias
        )
        self.post_ff_norm = RMSNorm(
            weights, f"{prefix}post_feedforward_layernorm.weight", hidden, eps
        )


class Olmo2(FastModel):
    def __init__(self, config: ModelConfig, weights: WeightSource, options: BuildOptions) -> None:
        super().__init__(config, weights, options)
        self.layers = [
            Olmo2Layer(config, weights, f"model.layers.{layer}.", self.attention(weights, layer))
            for layer in range(config.num_layers)
        ]

    def forward(self, step: StepTensors, kv: torch.Tensor) -> torch.Tensor:
        x = self.embed_tokens(step.input_ids)
        for layer in self.layers:
            sublayer = layer.attn(x, step, kv)
            x += layer.post_attn_norm(sublayer, out=sublayer)
            sublayer = layer.mlp(x)
            x += layer.post_ff_norm(sublayer, out=sublayer)
        return self.final_norm(x)
