"""Llama-family decoder, driven by config fields: Llama 2/3 (llama3 rope scaling), Mistral
(sliding window -> a Window group), Qwen2/2.5 (q/k/v bias), Qwen3 (per-head q/k RMS norm),
SmolLM2 (tied embeddings); the attention also serves gpt-oss (sinks) and OLMo 2 (whole-width
q/k norm). Parameter names are Hugging Face's, so checkpoints load unchanged.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from resin_model.config import ModelConfig
from resin_model.nn import RMSNorm
from resin_models_torch.base import AttentionProjections, Backbone, CausalLM
from resin_models_torch.batch import LayerSlot, StepContext
from resin_models_torch.layers import GatedMLP, Rotary, apply_rotary, paged_attention

MlpFactory = Callable[[ModelConfig, int], nn.Module]

_WEIGHT_IN_FLOAT32 = frozenset({"olmo2", "gpt_oss"})
"""Model types whose transformers RMS norm multiplies by the weight before rounding."""


def norm(config: ModelConfig, dim: int) -> RMSNorm:
    """The model's RMS norm over `dim`, rounding where its transformers code rounds."""
    return RMSNorm(dim, config.norm_eps, weight_in_float32=config.model_type in _WEIGHT_IN_FLOAT32)


class LlamaAttention(AttentionProjections):
    def __init__(self, config: ModelConfig, slot: LayerSlot) -> None:
        super().__init__(config, slot)
        d = config.head_dim
        # q/k norm per head (Qwen3) or over all heads at once (OLMo 2).
        q_width, k_width = (d, d) if config.qk_norm_per_head else (config.q_size, config.kv_size)
        self.q_norm = norm(config, q_width) if config.qk_norm else None
        self.k_norm = norm(config, k_width) if config.qk_norm else None
        # gpt-oss: one learned "sink" logit per head joins every softmax (and takes mass).
        self.sinks = nn.Parameter(torch.zeros(config.num_heads)) if config.sinks else None

    def forward(
        self, x: torch.Tensor, ctx: StepContext, cos: torch.Tensor, sin: torch.Tensor
    ) -> torch.Tensor:
        t, d = x.shape[0], self.config.head_dim
        q, k = self.q_proj(x), self.k_proj(x)
        if self.q_norm is not None and self.k_norm is not None:
            if self.config.qk_norm_per_head:
                q, k = q.view(t, -1, d), k.view(t, -1, d)
            q, k = self.q_norm(q), self.k_norm(k)
        q, k, v = q.view(t, -1, d), k.view(t, -1, d), self.v_proj(x).view(t, -1, d)
        q, k = apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
        cache, batch = ctx.attention(self.slot)
        attn = paged_attention(q, k, v, cache, batch, self.config.scale, sinks=self.sinks)
        out: torch.Tensor = self.o_proj(attn)
        return out


class LlamaLayer(nn.Module):
    def __init__(self, config: ModelConfig, index: int, slot: LayerSlot, mlp: nn.Module) -> None:
        super().__init__()
        self.input_layernorm = norm(config, config.hidden_size)
        self.self_attn = LlamaAttention(config, slot)
        self.post_attention_layernorm = norm(config, config.hidden_size)
        self.mlp = mlp

    def forward(
        self, x: torch.Tensor, ctx: StepContext, cos: torch.Tensor, sin: torch.Tensor
    ) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x), ctx, cos, sin)
        out: torch.Tensor = x + self.mlp(self.post_attention_layernorm(x))
        return out


def dense_mlp(config: ModelConfig, index: int) -> nn.Module:
    return GatedMLP(
        config.hidden_size, config.intermediate_size, config.hidden_act, config.mlp_bias
    )


class LlamaForCausalLM(CausalLM):
    def __init__(self, config: ModelConfig, mlp: MlpFactory = dense_mlp) -> None:
        super().__init__(config)
        layers = nn.ModuleList(
            LlamaLayer(config, i, self.slots[i], mlp(config, i)) for i in range(config.num_layers)
        )
        self.model = Backbone(config, layers, norm(config, config.hidden_size))
        self.rotary = Rotary(config.rope, config.rotary_dim)

    def forward(self, input_ids: torch.Tensor, ctx: StepContext) -> torch.Tensor:
        x = self.embed(input_ids)
        cos, sin = self.rotary.cos_sin(ctx.positions)
        for layer in self.model.layers:
            x = layer(x, ctx, cos, sin)
        out: torch.Tensor = self.model.norm(x)
        return out
