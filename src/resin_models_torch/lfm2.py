"""LFM2: a hybrid of gated short-convolution layers and attention layers, which become a State
group (each conv layer keeps its last K-1 inputs) and a History group. Attention layers use
per-head q/k RMS norms; every layer is pre-norm (operator_norm, ffn_norm) with a SwiGLU MLP
named w1/w3/w2; the final norm is called `embedding_norm`."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from resin_model.config import ModelConfig
from resin_model.nn import RMSNorm
from resin_models_torch.base import Backbone, CausalLM
from resin_models_torch.batch import LayerSlot, StepContext
from resin_models_torch.layers import Rotary, apply_rotary, paged_attention, short_conv


class Lfm2Attention(nn.Module):
    def __init__(self, config: ModelConfig, slot: LayerSlot) -> None:
        super().__init__()
        self.config = config
        self.slot = slot
        hidden, d = config.hidden_size, config.head_dim
        self.q_proj = nn.Linear(hidden, config.num_heads * d, bias=False)
        self.k_proj = nn.Linear(hidden, config.num_kv_heads * d, bias=False)
        self.v_proj = nn.Linear(hidden, config.num_kv_heads * d, bias=False)
        self.out_proj = nn.Linear(config.num_heads * d, hidden, bias=False)
        self.q_layernorm = RMSNorm(d, config.norm_eps)
        self.k_layernorm = RMSNorm(d, config.norm_eps)

    def forward(
        self, x: torch.Tensor, ctx: StepContext, cos: torch.Tensor, sin: torch.Tensor
    ) -> torch.Tensor:
        t, d = x.shape[0], self.config.head_dim
        q = self.q_layernorm(self.q_proj(x).view(t, -1, d))
        k = self.k_layernorm(self.k_proj(x).view(t, -1, d))
        v = self.v_proj(x).view(t, -1, d)
        q, k = apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
        cache, batch = ctx.attention(self.slot)
        out: torch.Tensor = self.out_proj(paged_attention(q, k, v, cache, batch, self.config.scale))
        return out


class Lfm2ShortConv(nn.Module):
    """in_proj -> (b, c, x); y = c * conv(b * x) over time; out_proj."""

    def __init__(self, config: ModelConfig, slot: LayerSlot) -> None:
        super().__init__()
        self.slot = slot
        hidden = config.hidden_size
        self.in_proj = nn.Linear(hidden, 3 * hidden, bias=config.conv_bias)
        self.conv = nn.Conv1d(
            hidden, hidden, config.conv_kernel, groups=hidden, bias=config.conv_bias
        )
        self.out_proj = nn.Linear(hidden, hidden, bias=config.conv_bias)

    def forward(self, x: torch.Tensor, ctx: StepContext) -> torch.Tensor:
        b, c, h = self.in_proj(x).chunk(3, dim=-1)
        cache, batch = ctx.state(self.slot)
        conv = short_conv(b * h, self.conv.weight, self.conv.bias, cache, batch)
        out: torch.Tensor = self.out_proj(c * conv)
        return out


class Lfm2MLP(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.w1 = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.w3 = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.w2 = nn.Linear(config.intermediate_size, config.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.w2(F.silu(self.w1(x)) * self.w3(x))
        return out


class Lfm2Layer(nn.Module):
    def __init__(self, config: ModelConfig, slot: LayerSlot, is_conv: bool) -> None:
        super().__init__()
        self.operator_norm = RMSNorm(config.hidden_size, config.norm_eps)
        self.conv = Lfm2ShortConv(config, slot) if is_conv else None
        self.self_attn = None if is_conv else Lfm2Attention(config, slot)
        self.ffn_norm = RMSNorm(config.hidden_size, config.norm_eps)
        self.feed_forward = Lfm2MLP(config)

    def forward(
        self, x: torch.Tensor, ctx: StepContext, cos: torch.Tensor, sin: torch.Tensor
    ) -> torch.Tensor:
        h = self.operator_norm(x)
        if self.conv is not None:
            x = x + self.conv(h, ctx)
        else:
            assert self.self_attn is not None
            x = x + self.self_attn(h, ctx, cos, sin)
        out: torch.Tensor = x + self.feed_forward(self.ffn_norm(x))
        return out


class Lfm2Backbone(Backbone):
    """LFM2 names its final norm `embedding_norm`."""

    def __init__(self, config: ModelConfig, layers: nn.ModuleList) -> None:
        super().__init__(config, layers, nn.Identity())
        del self.norm
        self.embedding_norm = RMSNorm(config.hidden_size, config.norm_eps)


class Lfm2ForCausalLM(CausalLM):
    model: Lfm2Backbone

    def __init__(self, config: ModelConfig) -> None:
        super().__init__(config)
        layers = nn.ModuleList(
            Lfm2Layer(config, self.slots[i], kind == "conv")
            for i, kind in enumerate(config.layer_types)
        )
        self.model = Lfm2Backbone(config, layers)
        self.rotary = Rotary(config.rope, config.head_dim)

    def forward(self, input_ids: torch.Tensor, ctx: StepContext) -> torch.Tensor:
        x = self.embed(input_ids)
        cos, sin = self.rotary.cos_sin(ctx.positions)
        for layer in self.model.layers:
            x = layer(x, ctx, cos, sin)
        out: torch.Tensor = self.model.embedding_norm(x)
        return out
