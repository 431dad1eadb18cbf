"""OLMo 2: the Llama layout with the norms moved after each sublayer (post-norm on the
sublayer's output, before it joins the residual; no pre-norms) and q/k RMS norms over the whole
projection width (all heads at once) before rotary. Hugging Face parameter names."""

from __future__ import annotations

import torch
from torch import nn

from resin_model.config import ModelConfig
from resin_models_torch.base import Backbone, CausalLM
from resin_models_torch.batch import LayerSlot, StepContext
from resin_models_torch.layers import Rotary
from resin_models_torch.llama import LlamaAttention, dense_mlp, norm


class Olmo2Layer(nn.Module):
    def __init__(self, config: ModelConfig, index: int, slot: LayerSlot) -> None:
        super().__init__()
        self.self_attn = LlamaAttention(config, slot)
        self.post_attention_layernorm = norm(config, config.hidden_size)
        self.mlp = dense_mlp(config, index)
        self.post_feedforward_layernorm = norm(config, config.hidden_size)

    def forward(
        self, x: torch.Tensor, ctx: StepContext, cos: torch.Tensor, sin: torch.Tensor
    ) -> torch.Tensor:
        x = x + self.post_attention_layernorm(self.self_attn(x, ctx, cos, sin))
        out: torch.Tensor = x + self.post_feedforward_layernorm(self.mlp(x))
        return out


class Olmo2ForCausalLM(CausalLM):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__(config)
        layers = nn.ModuleList(
            Olmo2Layer(config, i, self.slots[i]) for i in range(config.num_layers)
        )
        self.model = Backbone(config, layers, norm(config, config.hidden_size))
        self.rotary = Rotary(config.rope, config.head_dim)

    def forward(self, input_ids: torch.Tensor, ctx: StepContext) -> torch.Tensor:
        x = self.embed(input_ids)
        cos, sin = self.rotary.cos_sin(ctx.positions)
        for layer in self.model.layers:
            x = layer(x, ctx, cos, sin)
        out: torch.Tensor = self.model.norm(x)
        return out
