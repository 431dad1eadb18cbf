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
    def __init__(self, model: Olmo2, i: int, w: WeightSource) -> None:
        c, p = model.config, f"model.layers.{i}."
        h = c.hidden_size
        self.attn = Attention(
            c, w, f"{p}self_attn.", model.slots[i], model.window(i), model.rotary(i)
        )
        self.post_attn_norm = RMSNorm(w, f"{p}post_attention_layernorm.weight", h, c.norm_eps)
        self.mlp = GatedMLP(w, f"{p}mlp.", h, c.intermediate_size, c.hidden_act, c.mlp_bias)
        self.post_ff_norm = RMSNorm(w, f"{p}post_feedforward_layernorm.weight", h, c.norm_eps)


class Olmo2(FastModel):
    def __init__(self, config: ModelConfig, w: WeightSource, options: BuildOptions) -> None:
        super().__init__(config, w, options)
        self.layers = [Olmo2Layer(self, i, w) for i in range(config.num_layers)]

    def forward(self, step: StepTensors, kv: torch.Tensor) -> torch.Tensor:
        x = self.embed_tokens(step.input_ids)
        for layer in self.layers:
            h = layer.attn(x, step, kv)
            x += layer.post_attn_norm(h, out=h)
            h = layer.mlp(x)
            x += layer.post_ff_norm(h, out=h)
        return self.final_norm(x)
