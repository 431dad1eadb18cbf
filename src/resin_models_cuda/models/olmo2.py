"""OLMo 2 on the fast layer library: no pre-norms (each sublayer reads the residual stream
itself), a post-norm on each sublayer's output before it joins the residual, and q/k RMS norms
over the whole projection width (`qk_norm_per_head=False`) before rotary."""

from __future__ import annotations

import torch

from resin_models_cuda.layers import Attention, GatedMLP, RMSNorm, WeightSource
from resin_models_cuda.models.base import BuildOptions, FastModel
from resin_models_cuda.step import StepTensors
from resin_models_torch.config import ModelConfig


class Olmo2Layer:
    def __init__(self, model: Olmo2, i: int, w: WeightSource) -> None:
        c, p = model.config, f"model.layers.{i}."
        h = c.hidden_size
        self.attn = Attention(
            c, w, f"{p}self_attn.", model.slots[i], model.window(i), model.rotary(i)
        )
        self.post_attn_norm = RMSNorm(w, f"{p}post_attention_layernorm.weight", h, c.norm_eps)
        self.mlp = GatedMLP(w, f"{p}mlp.", h, c.intermediate_size, c.hidden_act)
        self.post_ff_norm = RMSNorm(w, f"{p}post_feedforward_layernorm.weight", h, c.norm_eps)


class Olmo2(FastModel):
    def __init__(self, config: ModelConfig, w: WeightSource, options: BuildOptions) -> None:
        super().__init__(config, w, options)
        self.layers = [Olmo2Layer(self, i, w) for i in range(config.num_layers)]

    def forward(self, step: StepTensors, kv: torch.Tensor) -> torch.Tensor:
        x = self.embed_tokens(step.input_ids)
        for layer in self.layers:
            x = x + layer.post_attn_norm(layer.attn(x, step, kv))
            x = x + layer.post_ff_norm(layer.mlp(x))
        return self.final_norm(x)
