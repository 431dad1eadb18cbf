"""Qwen3.5 MoE (`qwen3_5_moe`, text path): three Gated DeltaNet linear-attention layers per
gated full-attention layer (the checkpoint's `layer_types`), every layer a softmax top-k MoE
with a sigmoid-gated shared expert.

- Linear attention (`linear_attn.*`): in_proj_qkv -> depthwise causal conv (SiLU) over q|k|v,
  l2-normed q/k repeated onto the value heads, per-head decay
  `g = -exp(A_log) * softplus(a + dt_bias)` and `beta = sigmoid(b)`, the gated delta rule in
  float32 (`delta_rule.py`), a gated RMS norm per value head (SiLU of `in_proj_z`), out_proj.
  Its state (conv inputs + float32 recurrent matrices) is one `LinearStateSpec` State group.
- Full attention (`self_attn.*`): q_proj emits each head's query and its output gate side by
  side; q/k zero-centred RMS norm per head, rotary on the leading `partial_rotary_factor` of
  each head (M-RoPE with equal text positions on all axes is plain rotary), GQA, the output
  times sigmoid(gate), o_proj. History group.
- Norms are zero-centred (`x * (1 + w)`, weights stored as w), except the gated norm (`w * x`).

The multimodal folder (`model.language_model.*`) loads its text path; `model.visual.*` (the
vision tower) and `mtp.*` (the MTP head) are skipped.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from resin_model.checkpoint_names import default_names
from resin_model.config import LinearAttentionConfig, ModelConfig
from resin_model.nn import RMSNorm
from resin_models_torch.base import Backbone, CausalLM
from resin_models_torch.batch import LayerSlot, LinearStateSpec, StepContext
from resin_models_torch.delta_rule import delta_rule_rows
from resin_models_torch.layers import (
    GatedMLP,
    Rotary,
    SparseMoe,
    apply_rotary,
    paged_attention,
    short_conv,
)


def l2norm(x: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    return x * torch.rsqrt((x * x).sum(dim=-1, keepdim=True) + eps)


class GatedRMSNorm(nn.Module):
    """RMS norm in float32, then `w * x` in the input dtype, times SiLU(gate) in float32."""

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
        xf = x.float()
        normed = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        out = (self.weight * normed.to(x.dtype)) * F.silu(gate.float())
        return out.to(x.dtype)


class GatedDeltaNet(nn.Module):
    """Qwen3.5's linear attention, Hugging Face parameter names. `chunk` is the chunked
    delta rule's chunk (None: the recurrent form for every token, as a cross-check)."""

    def __init__(
        self, config: ModelConfig, linear: LinearAttentionConfig, slot: LayerSlot, spec: object
    ) -> None:
        super().__init__()
        assert isinstance(spec, LinearStateSpec)
        self.slot, self.spec, self.linear = slot, spec, linear
        self.chunk: int | None = 64
        hidden = config.hidden_size
        key_dim = linear.num_k_heads * linear.k_head_dim
        value_dim = linear.num_v_heads * linear.v_head_dim
        channels = linear.conv_channels
        self.conv1d = nn.Conv1d(channels, channels, linear.conv_kernel, groups=channels, bias=False)
        self.dt_bias = nn.Parameter(torch.ones(linear.num_v_heads))
        self.A_log = nn.Parameter(torch.zeros(linear.num_v_heads))
        self.norm = GatedRMSNorm(linear.v_head_dim, config.norm_eps)
        self.out_proj = nn.Linear(value_dim, hidden, bias=False)
        self.in_proj_qkv = nn.Linear(hidden, 2 * key_dim + value_dim, bias=False)
        self.in_proj_z = nn.Linear(hidden, value_dim, bias=False)
        self.in_proj_b = nn.Linear(hidden, linear.num_v_heads, bias=False)
        self.in_proj_a = nn.Linear(hidden, linear.num_v_heads, bias=False)
        self.key_dim = key_dim

    def forward(self, x: torch.Tensor, ctx: StepContext) -> torch.Tensor:
        lin, t = self.linear, x.shape[0]
        cache, batch = ctx.state(self.slot)
        conv_cache, recurrent = self.spec.split(cache, x.dtype)
        mixed = F.silu(short_conv(self.in_proj_qkv(x), self.conv1d.weight, None, conv_cache, batch))
        q, k, v = mixed.split((self.key_dim, self.key_dim, mixed.shape[1] - 2 * self.key_dim), -1)
        repeat = lin.num_v_heads // lin.num_k_heads
        q = q.reshape(t, lin.num_k_heads, -1).repeat_interleave(repeat, dim=1).float()
        k = k.reshape(t, lin.num_k_heads, -1).repeat_interleave(repeat, dim=1).float()
        q = l2norm(q) * lin.k_head_dim**-0.5
        k = l2norm(k)
        beta = torch.sigmoid(self.in_proj_b(x)).float()
        g = -self.A_log.float().exp() * F.softplus(self.in_proj_a(x).float() + self.dt_bias)
        v = v.reshape(t, lin.num_v_heads, -1).float()
        out = delta_rule_rows(q, k, v, g.float(), beta, recurrent, batch, self.chunk).to(x.dtype)
        z = self.in_proj_z(x).view(t, lin.num_v_heads, -1)
        normed: torch.Tensor = self.out_proj(self.norm(out, z).reshape(t, -1))
        return normed


class GatedAttention(nn.Module):
    """Full attention whose q_proj also emits a per-channel output gate."""

    def __init__(self, config: ModelConfig, slot: LayerSlot) -> None:
        super().__init__()
        self.config, self.slot = config, slot
        hidden, d = config.hidden_size, config.head_dim
        self.q_proj = nn.Linear(hidden, 2 * config.num_heads * d, bias=config.qkv_bias)
        self.k_proj = nn.Linear(hidden, config.num_kv_heads * d, bias=config.qkv_bias)
        self.v_proj = nn.Linear(hidden, config.num_kv_heads * d, bias=config.qkv_bias)
        self.o_proj = nn.Linear(config.num_heads * d, hidden, bias=config.o_bias)
        self.q_norm = RMSNorm(d, config.norm_eps, unit_offset=True)
        self.k_norm = RMSNorm(d, config.norm_eps, unit_offset=True)

    def forward(
        self, x: torch.Tensor, ctx: StepContext, cos: torch.Tensor, sin: torch.Tensor
    ) -> torch.Tensor:
        t, d = x.shape[0], self.config.head_dim
        q, gate = self.q_proj(x).view(t, -1, 2 * d).chunk(2, dim=-1)
        q = self.q_norm(q)
        k = self.k_norm(self.k_proj(x).view(t, -1, d))
        v = self.v_proj(x).view(t, -1, d)
        q, k = apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
        cache, batch = ctx.attention(self.slot)
        attn = paged_attention(q, k, v, cache, batch, self.config.scale)
        out: torch.Tensor = self.o_proj(attn * torch.sigmoid(gate.reshape(t, -1)))
        return out


class SharedExpertMoe(SparseMoe):
    """Routed experts plus a shared expert scaled by sigmoid(shared_expert_gate(x))."""

    def __init__(self, config: ModelConfig) -> None:
        moe = config.moe
        assert moe is not None
        hidden, act = config.hidden_size, config.hidden_act
        super().__init__(hidden, moe.intermediate_size, moe.num_experts, moe.top_k, True, act)
        self.shared_expert = GatedMLP(hidden, moe.shared_intermediate_size, act)
        self.shared_expert_gate = nn.Linear(hidden, 1, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shared = torch.sigmoid(self.shared_expert_gate(x)) * self.shared_expert(x)
        out: torch.Tensor = super().forward(x) + shared
        return out


class Qwen3_5MoeLayer(nn.Module):
    def __init__(self, config: ModelConfig, slot: LayerSlot, spec: object, kind: str) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(config.hidden_size, config.norm_eps, unit_offset=True)
        linear = config.linear_attention
        self.linear_attn = (
            GatedDeltaNet(config, linear, slot, spec)
            if kind == "linear" and linear is not None
            else None
        )
        self.self_attn = None if kind == "linear" else GatedAttention(config, slot)
        self.post_attention_layernorm = RMSNorm(
            config.hidden_size, config.norm_eps, unit_offset=True
        )
        self.mlp = SharedExpertMoe(config)

    def forward(
        self, x: torch.Tensor, ctx: StepContext, cos: torch.Tensor, sin: torch.Tensor
    ) -> torch.Tensor:
        h = self.input_layernorm(x)
        if self.linear_attn is not None:
            x = x + self.linear_attn(h, ctx)
        else:
            assert self.self_attn is not None
            x = x + self.self_attn(h, ctx, cos, sin)
        out: torch.Tensor = x + self.mlp(self.post_attention_layernorm(x))
        return out


class Qwen3_5MoeForCausalLM(CausalLM):
    def __init__(self, config: ModelConfig) -> None:
        if config.moe is None or config.linear_attention is None:
            raise ValueError("qwen3_5_moe needs MoE and linear-attention configs")
        super().__init__(config)
        layers = nn.ModuleList(
            Qwen3_5MoeLayer(config, slot, self.cache_specs[slot.group], kind)
            for slot, kind in zip(self.slots, config.layer_types, strict=True)
        )
        norm = RMSNorm(config.hidden_size, config.norm_eps, unit_offset=True)
        self.model = Backbone(config, layers, norm)
        self.rotary = Rotary(config.rope, config.rotary_dim)

    def checkpoint_name(self, name: str) -> str | None:
        """Text path only: the vision tower and the MTP head are not loaded."""
        if name.startswith(("mtp.", "model.visual.", "visual.")):
            return None
        return default_names(name)

    def split_tensor(self, name: str, tensor: torch.Tensor) -> list[tuple[str, torch.Tensor]]:
        """The published checkpoints fuse each layer's experts: `experts.gate_up_proj`
        [E, 2I, H] (gate rows, then up rows) and `experts.down_proj` [E, H, I]; folders that
        `transformers` saves list them one expert at a time, as this model holds them."""
        prefix, _, kind = name.rpartition(".experts.")
        if kind == "gate_up_proj":
            gate, up = tensor.chunk(2, dim=1)
            return [
                (f"{prefix}.experts.{e}.{part}.weight", weight[e])
                for e in range(tensor.shape[0])
                for part, weight in (("gate_proj", gate), ("up_proj", up))
            ]
        if kind == "down_proj":
            return [
                (f"{prefix}.experts.{e}.down_proj.weight", tensor[e]) for e in range(len(tensor))
            ]
        return [(name, tensor)]

    def forward(self, input_ids: torch.Tensor, ctx: StepContext) -> torch.Tensor:
        x = self.embed(input_ids)
        cos, sin = self.rotary.cos_sin(ctx.positions)
        for layer in self.model.layers:
            x = layer(x, ctx, cos, sin)
        out: torch.Tensor = self.model.norm(x)
        return out
