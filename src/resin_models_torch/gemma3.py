"""Gemma 3 (text): interleaved sliding-window and global attention layers, which become a
Window group and a History group. Gemma specifics: (1 + w) RMS norms, four norms per layer
(pre/post attention, pre/post MLP), embeddings scaled by sqrt(hidden), per-head q/k norms,
scores scaled by query_pre_attn_scalar, a local rope base for sliding layers, GELU-tanh MLP,
optional logit softcapping."""

from __future__ import annotations

import torch
from torch import nn

from resin_model.config import ModelConfig
from resin_model.nn import RMSNorm
from resin_models_torch.base import AttentionProjections, Backbone, CausalLM
from resin_models_torch.batch import LayerSlot, StepContext
from resin_models_torch.layers import GatedMLP, Rotary, apply_rotary, paged_attention


def _norm(config: ModelConfig, dim: int) -> RMSNorm:
    return RMSNorm(dim, config.norm_eps, unit_offset=True)


class Gemma3Attention(AttentionProjections):
    def __init__(self, config: ModelConfig, slot: LayerSlot) -> None:
        super().__init__(config, slot)
        d = config.head_dim
        self.q_norm = _norm(config, d)
        self.k_norm = _norm(config, d)

    def forward(
        self, x: torch.Tensor, ctx: StepContext, cos: torch.Tensor, sin: torch.Tensor
    ) -> torch.Tensor:
        t, d = x.shape[0], self.config.head_dim
        q = self.q_norm(self.q_proj(x).view(t, -1, d))
        k = self.k_norm(self.k_proj(x).view(t, -1, d))
        v = self.v_proj(x).view(t, -1, d)
        q, k = apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
        cache, batch = ctx.attention(self.slot)
        softcap = self.config.attn_logit_softcapping
        out: torch.Tensor = self.o_proj(
            paged_attention(q, k, v, cache, batch, self.config.scale, softcap)
        )
        return out


class Gemma3Layer(nn.Module):
    def __init__(self, config: ModelConfig, slot: LayerSlot, sliding: bool) -> None:
        super().__init__()
        self.sliding = sliding
        hidden = config.hidden_size
        self.input_layernorm = _norm(config, hidden)
        self.self_attn = Gemma3Attention(config, slot)
        self.post_attention_layernorm = _norm(config, hidden)
        self.pre_feedforward_layernorm = _norm(config, hidden)
        self.mlp = GatedMLP(hidden, config.intermediate_size, config.hidden_act)
        self.post_feedforward_layernorm = _norm(config, hidden)

    def forward(
        self, x: torch.Tensor, ctx: StepContext, cos: torch.Tensor, sin: torch.Tensor
    ) -> torch.Tensor:
        h = self.self_attn(self.input_layernorm(x), ctx, cos, sin)
        x = x + self.post_attention_layernorm(h)
        h = self.mlp(self.pre_feedforward_layernorm(x))
        out: torch.Tensor = x + self.post_feedforward_layernorm(h)
        return out


class Gemma3ForCausalLM(CausalLM):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__(config)
        layers = nn.ModuleList(
            Gemma3Layer(config, self.slots[i], kind == "sliding")
            for i, kind in enumerate(config.layer_types)
        )
        self.model = Backbone(config, layers, _norm(config, config.hidden_size))
        self.rotary_global = Rotary(config.rope, config.head_dim)
        self.rotary_local = Rotary(config.local_rope or config.rope, config.head_dim)

    def forward(self, input_ids: torch.Tensor, ctx: StepContext) -> torch.Tensor:
        return self.run_layers(self.embed(input_ids), ctx)

    def run_layers(self, x: torch.Tensor, ctx: StepContext) -> torch.Tensor:
        global_rope = self.rotary_global.cos_sin(ctx.positions)
        local_rope = self.rotary_local.cos_sin(ctx.positions)
        for layer in self.model.layers:
            cos, sin = local_rope if layer.sliding else global_rope
            x = layer(x, ctx, cos, sin)
        out: torch.Tensor = self.model.norm(x)
        return out
