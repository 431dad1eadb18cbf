"""GLM-5.3-Flash (`glm5_next`, text path): three KDA linear-attention layers per indexed MLA
layer, mHC residual streams, clamped SwiGLU MLPs (dense first layers, then sigmoid-routed
experts with a shared expert). No positional encoding anywhere.

- KDA (`self_attn.*` of "linear" layers): q/k/v projections -> depthwise causal conv (float32
  weights, SiLU) with its state -> l2-normed q/k; a per-channel forget gate
  `g = lower * sigmoid(exp(A_log) * (f_b(f_a(x)) + dt_bias))` (or `-exp(A_log) *
  softplus(.)` without a lower bound), `beta = sigmoid(b_proj(x))`; the delta rule with
  per-key-channel decay in float32 (`delta_rule.py`); a float32 gated RMS norm per head with a
  sigmoid gate from `g_b(g_a(x))`; o_proj. Its state is a `LinearStateSpec` State group.
- Indexed MLA (`self_attn.*` of "full" layers): DeepSeek's latent attention with q LoRA and no
  rotary part; which keys a query reads is the DSA indexer's choice: pools of `index_kpool`
  tokens, each summarised by a gate-weighted softmax over its tokens' indexer keys, scored by
  `sum_h w_h relu(q_h . P / sqrt(d))`; the best `index_topk / index_kpool` complete pools whose
  last token the query sees, plus the query's own incomplete pool (the tail), always. Up to
  `index_topk / index_kpool` complete pools everything visible is chosen (dense attention).
  The cache keeps, per token and layer, the normed latent and the indexer's key and gate
  score side by side (one History group of width kv_lora_rank + 2 x index_head_dim).
- mHC (`mhc.py`): `hc_mult` residual streams; each sub-block collapses them (`pre`), spreads
  its output back (`post`) and mixes the old streams (`comb`); the final collapse is their mean.

Checkpoint names are the published layout's (`hc_attn_fn`, `q_conv1d`, `self_attn.dt_bias`,
one tensor per expert): `checkpoint_name` maps them onto this model. The vision tower
(`model.visual.*`) and the MTP layer (`layers.{num_hidden_layers}.*`) are not loaded.
"""

from __future__ import annotations

import re

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from resin_model.checkpoint_names import default_names
from resin_model.config import Glm5NextConfig, ModelConfig
from resin_model.expert_routing import deepseek_route
from resin_model.hf_glm5_next import rename_published
from resin_model.nn import RMSNorm
from resin_models_torch.base import Backbone, CausalLM
from resin_models_torch.batch import (
    AttentionBatch,
    LatentSpec,
    LayerSlot,
    LinearStateSpec,
    StepContext,
)
from resin_models_torch.deepseek import DeepseekRouter
from resin_models_torch.delta_rule import delta_rule_rows
from resin_models_torch.layers import Float32Module, GatedMLP, short_conv
from resin_models_torch.mhc import HyperConnection, hc_mix
from resin_models_torch.mla import paged_latents

_LAYER = re.compile(r"^model\.layers\.(\d+)\.")


class ClampedMLP(GatedMLP):
    """down(silu(min(gate, l)) * clamp(up, -l, l))."""

    def __init__(self, hidden: int, inner: int, act: str, limit: float) -> None:
        super().__init__(hidden, inner, act)
        self.limit = limit

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate = self.gate_proj(x).clamp(max=self.limit)
        up = self.up_proj(x).clamp(-self.limit, self.limit)
        out: torch.Tensor = self.down_proj(self.act(gate) * up)
        return out


class Glm5Moe(nn.Module):
    """Sigmoid-routed experts (DeepSeek-V3's rule, float32 router) plus the shared experts,
    every SwiGLU clamped."""

    def __init__(self, config: ModelConfig, glm: Glm5NextConfig) -> None:
        super().__init__()
        moe = config.moe
        assert moe is not None
        hidden, act, limit = config.hidden_size, config.hidden_act, glm.swiglu_limit
        self.moe = moe
        self.gate = DeepseekRouter(hidden, moe)
        self.experts = nn.ModuleList(
            ClampedMLP(hidden, moe.intermediate_size, act, limit) for _ in range(moe.num_experts)
        )
        self.shared_experts = ClampedMLP(hidden, moe.shared_intermediate_size, act, limit)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        logits = F.linear(x.float(), self.gate.weight.float())
        weights, chosen = deepseek_route(logits, self.gate.e_score_correction_bias, self.moe)
        out = torch.zeros_like(x)
        for expert_id in torch.unique(chosen).tolist():
            token_idx, slot = torch.where(chosen == expert_id)
            y = self.experts[expert_id](x[token_idx]) * weights[token_idx, slot, None]
            out.index_add_(0, token_idx, y.to(x.dtype))
        shared: torch.Tensor = self.shared_experts(x)
        return out + shared


class Float32Conv(Float32Module):
    """A depthwise conv weight [channels, 1, K] kept in float32."""

    def __init__(self, channels: int, kernel: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(channels, 1, kernel))


class KdaDecay(Float32Module):
    """The forget gate's float32 parameters: `dt_bias` [heads * head_dim], `A_log` [heads]."""

    def __init__(self, heads: int, head_dim: int) -> None:
        super().__init__()
        self.dt_bias = nn.Parameter(torch.zeros(heads * head_dim))
        self.A_log = nn.Parameter(torch.zeros(heads))


def kda_l2norm(x: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    return x / torch.sqrt((x * x).sum(dim=-1, keepdim=True) + eps)


class SigmoidGatedNorm(nn.Module):
    """RMS norm and weight in float32, times sigmoid(gate), cast back."""

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
        xf = x.float()
        normed = self.weight.float() * (
            xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        )
        return (normed * torch.sigmoid(gate.float())).to(x.dtype)


class KimiDeltaAttention(nn.Module):
    def __init__(
        self, config: ModelConfig, glm: Glm5NextConfig, slot: LayerSlot, spec: object
    ) -> None:
        super().__init__()
        lin = config.linear_attention
        assert lin is not None and isinstance(spec, LinearStateSpec)
        self.slot, self.spec, self.glm = slot, spec, glm
        self.heads, self.head_dim = lin.num_v_heads, lin.v_head_dim
        self.chunk: int | None = 64
        hidden, width = config.hidden_size, lin.num_v_heads * lin.v_head_dim
        self.q_proj = nn.Linear(hidden, width, bias=False)
        self.k_proj = nn.Linear(hidden, width, bias=False)
        self.v_proj = nn.Linear(hidden, width, bias=False)
        self.q_conv1d = Float32Conv(width, lin.conv_kernel)
        self.k_conv1d = Float32Conv(width, lin.conv_kernel)
        self.v_conv1d = Float32Conv(width, lin.conv_kernel)
        self.f_a_proj = nn.Linear(hidden, self.head_dim, bias=False)
        self.f_b_proj = nn.Linear(self.head_dim, width, bias=False)
        self.decay = KdaDecay(self.heads, self.head_dim)
        self.b_proj = nn.Linear(hidden, self.heads, bias=False)
        self.g_a_proj = nn.Linear(hidden, self.head_dim, bias=False)
        self.g_b_proj = nn.Linear(self.head_dim, width, bias=False)
        self.o_norm = SigmoidGatedNorm(self.head_dim, config.norm_eps)
        self.o_proj = nn.Linear(width, hidden, bias=False)

    def forget_gate(self, x: torch.Tensor) -> torch.Tensor:
        """Log decays [T, heads, head_dim] in float32 (<= 0)."""
        raw = self.f_b_proj(self.f_a_proj(x)).float() + self.decay.dt_bias.float()
        raw = raw.view(x.shape[0], self.heads, self.head_dim)
        rate = self.decay.A_log.float().exp()[None, :, None]
        lower = self.glm.gate_lower_bound
        if lower is not None:
            return lower * torch.sigmoid(rate * raw)
        softplus = torch.where(raw > 20.0, raw, torch.log(1.0 + torch.exp(raw)))
        return -rate * softplus

    def forward(self, x: torch.Tensor, ctx: StepContext) -> torch.Tensor:
        t, shape = x.shape[0], (x.shape[0], self.heads, self.head_dim)
        cache, batch = ctx.state(self.slot)
        conv_cache, recurrent = self.spec.split(cache, x.dtype)
        mixed = torch.cat((self.q_proj(x), self.k_proj(x), self.v_proj(x)), dim=-1)
        weight = torch.cat((self.q_conv1d.weight, self.k_conv1d.weight, self.v_conv1d.weight))
        conv = short_conv(mixed.float(), weight.float(), None, conv_cache, batch)
        q, k, v = F.silu(conv).to(x.dtype).chunk(3, dim=-1)
        q = kda_l2norm(q.reshape(shape).float()) * self.head_dim**-0.5
        k = kda_l2norm(k.reshape(shape).float())
        beta = torch.sigmoid(self.b_proj(x)).float()
        g = self.forget_gate(x)
        out = delta_rule_rows(q, k, v.reshape(shape).float(), g, beta, recurrent, batch, self.chunk)
        gate = self.g_b_proj(self.g_a_proj(x)).view(shape)
        result: torch.Tensor = self.o_proj(self.o_norm(out.to(x.dtype), gate).reshape(t, -1))
        return result


class Indexer(nn.Module):
    """GLM-5.3's DSA indexer with k-pools (parameter names transformers'); see the module
    docstring for the rule."""

    def __init__(self, config: ModelConfig, glm: Glm5NextConfig) -> None:
        super().__init__()
        assert config.mla is not None and config.mla.q_lora_rank is not None
        self.glm = glm
        d, heads = glm.index_head_dim, glm.index_heads
        self.wq_b = nn.Linear(config.mla.q_lora_rank, heads * d, bias=False)
        self.wk = nn.Linear(config.hidden_size, d, bias=False)
        self.k_norm = nn.LayerNorm(d, eps=1e-6)
        self.weights_proj = nn.Linear(config.hidden_size, heads, bias=False)
        self.index_kpool_compress_ape = nn.Parameter(torch.zeros(glm.index_kpool, d))
        self.index_kpool_compress_gate = nn.Parameter(torch.zeros(d, config.hidden_size))

    def entry(self, x: torch.Tensor) -> torch.Tensor:
        """What a token stores for the indexer: [key | pool gate score], [T, 2 * d]."""
        key = self.k_norm(self.wk(x))
        return torch.cat((key, F.linear(x, self.index_kpool_compress_gate)), dim=-1)

    def select(
        self,
        x: torch.Tensor,
        q_resid: torch.Tensor,
        entries: torch.Tensor,
        batch: AttentionBatch,
        positions: np.ndarray,
    ) -> torch.Tensor:
        """Which keys each query reads: bool [B, Q, C+Q] over the rows' cached then new keys.

        `entries` [B, C+Q, 2d] are the stored indexer entries in that order; a History row's
        valid keys are positions 0, 1, ... in order, so the n-th valid column is position n."""
        valid = batch.mask.any(dim=1)  # [B, C+Q]: the row's keys (each is seen by a query)
        chosen = torch.zeros_like(batch.mask)
        for row in range(entries.shape[0]):
            queries = batch.mask[row].any(dim=-1)
            if not queries.any():
                continue
            lanes = batch.query_index[row][queries]
            query_pos = torch.from_numpy(positions[row][: len(lanes)]).to(x.device)
            cols = torch.nonzero(valid[row])[:, 0]
            picked = self.choose(x[lanes], q_resid[lanes], entries[row, cols], query_pos)
            grid_cols = torch.nonzero(queries)[:, 0]
            chosen[row, grid_cols[:, None], cols[None, :]] = picked
        return chosen & batch.mask

    def pool_scores(
        self, x: torch.Tensor, q_resid: torch.Tensor, entries: torch.Tensor
    ) -> torch.Tensor:
        """Index scores [Q, P] of the complete pools of one sequence's entries [N, 2d] (the
        n-th is position n) for queries x [Q, hidden] / q_resid [Q, q_lora_rank]."""
        glm, d = self.glm, self.glm.index_head_dim
        pool, pools = glm.index_kpool, entries.shape[0] // glm.index_kpool
        keys, gates = entries[: pools * pool].split(d, dim=-1)
        logits = gates.float().view(pools, pool, d) + self.index_kpool_compress_ape.float()
        weights = logits.softmax(dim=1).to(keys.dtype)
        pooled = (weights * keys.view(pools, pool, d)).sum(dim=1)
        q = self.wq_b(q_resid).view(x.shape[0], glm.index_heads, d).float()
        scores = F.relu((q @ pooled.float().T) * d**-0.5)  # [Q, H, P]
        w = self.weights_proj(x).float() * glm.index_heads**-0.5
        out: torch.Tensor = (w[:, None, :] @ scores)[:, 0]
        return out

    def choose(
        self, x: torch.Tensor, q_resid: torch.Tensor, entries: torch.Tensor, query_pos: torch.Tensor
    ) -> torch.Tensor:
        """bool [Q, N]: the keys (positions 0..N-1) queries at `query_pos` read."""
        pool, n = self.glm.index_kpool, entries.shape[0]
        picked = torch.zeros(len(query_pos), n, dtype=torch.bool, device=x.device)
        pools = n // pool
        if pools:
            scores = self.pool_scores(x, q_resid, entries)
            last = torch.arange(pools, device=x.device) * pool + pool - 1
            candidate = last[None, :] <= query_pos[:, None]  # complete and seen by the query
            scores = scores.masked_fill(~candidate, torch.finfo(scores.dtype).min)
            top = scores.topk(min(self.glm.index_topk // pool, pools), dim=-1).indices
            keep = candidate.gather(1, top)[..., None].expand(-1, -1, pool).flatten(1)
            members = (top[..., None] * pool + torch.arange(pool, device=x.device)).flatten(1)
            picked.scatter_(1, members, keep)
        # The tail: the query's own incomplete pool, always read.
        seen = torch.arange(n, device=x.device)[None, :]
        tail_start = (query_pos + 1) - (query_pos + 1) % pool
        return picked | (seen >= tail_start[:, None]) & (seen <= query_pos[:, None])


class IndexedMla(nn.Module):
    """Latent attention without rotary (q LoRA, per-token normed latent), over the keys the
    indexer picks."""

    def __init__(self, config: ModelConfig, glm: Glm5NextConfig, slot: LayerSlot) -> None:
        super().__init__()
        mla = config.mla
        assert mla is not None and mla.q_lora_rank is not None
        self.mla, self.slot, self.scale = mla, slot, config.scale
        hidden, heads = config.hidden_size, config.num_heads
        self.q_a_proj = nn.Linear(hidden, mla.q_lora_rank, bias=False)
        self.q_a_layernorm = RMSNorm(mla.q_lora_rank, config.norm_eps)
        self.q_b_proj = nn.Linear(mla.q_lora_rank, heads * mla.nope_dim, bias=False)
        self.kv_a_proj_with_mqa = nn.Linear(hidden, mla.kv_lora_rank, bias=False)
        self.kv_a_layernorm = RMSNorm(mla.kv_lora_rank, config.norm_eps)
        self.kv_b_proj = nn.Linear(
            mla.kv_lora_rank, heads * (mla.nope_dim + mla.v_head_dim), bias=False
        )
        self.o_proj = nn.Linear(heads * mla.v_head_dim, hidden, bias=False)
        self.indexer = Indexer(config, glm)

    def forward(self, x: torch.Tensor, ctx: StepContext, positions: np.ndarray) -> torch.Tensor:
        mla, t = self.mla, x.shape[0]
        q_resid = self.q_a_layernorm(self.q_a_proj(x))
        queries = self.q_b_proj(q_resid).view(t, -1, mla.nope_dim)
        latent = self.kv_a_layernorm(self.kv_a_proj_with_mqa(x))
        cache, batch = ctx.attention(self.slot)
        entry = torch.cat((latent, self.indexer.entry(x)), dim=-1)
        entries = paged_latents(entry, cache, batch)  # [B, C+Q, width]
        mask = self.indexer.select(x, q_resid, entries[..., mla.kv_lora_rank :], batch, positions)
        b, k = entries.shape[:2]
        kv = self.kv_b_proj(entries[..., : mla.kv_lora_rank])
        keys, values = kv.view(b, k, -1, mla.nope_dim + mla.v_head_dim).split(
            [mla.nope_dim, mla.v_head_dim], dim=-1
        )
        scores = torch.einsum("bqhd,bkhd->bhqk", queries[batch.query_index], keys) * self.scale
        scores = scores.masked_fill(~mask[:, None], float("-inf"))
        probs = torch.nan_to_num(torch.softmax(scores, dim=-1, dtype=torch.float32)).to(x.dtype)
        out = torch.einsum("bhqk,bkhd->bqhd", probs, values)
        result: torch.Tensor = self.o_proj(out[batch.token_rows, batch.token_cols].reshape(t, -1))
        return result


class Glm5NextLayer(nn.Module):
    def __init__(
        self, config: ModelConfig, index: int, slot: LayerSlot, spec: object, kind: str
    ) -> None:
        super().__init__()
        glm = config.glm5_next
        assert glm is not None
        hidden, eps = config.hidden_size, config.norm_eps
        self.attn_hc = HyperConnection(hidden, glm.hc_mult, glm.hc_iterations, glm.hc_eps, eps)
        self.ffn_hc = HyperConnection(hidden, glm.hc_mult, glm.hc_iterations, glm.hc_eps, eps)
        self.input_layernorm = RMSNorm(hidden, eps)
        self.post_attention_layernorm = RMSNorm(hidden, eps)
        self.linear = kind == "linear"
        self.self_attn: nn.Module = (
            KimiDeltaAttention(config, glm, slot, spec)
            if self.linear
            else IndexedMla(config, glm, slot)
        )
        self.mlp: nn.Module = (
            Glm5Moe(config, glm)
            if config.is_sparse(index)
            else ClampedMLP(hidden, config.intermediate_size, config.hidden_act, glm.swiglu_limit)
        )

    def forward(
        self, streams: torch.Tensor, ctx: StepContext, positions: np.ndarray
    ) -> torch.Tensor:
        post, comb, h = self.attn_hc(streams)
        h = self.input_layernorm(h)
        out = self.self_attn(h, ctx) if self.linear else self.self_attn(h, ctx, positions)
        streams = hc_mix(streams, post, comb, out)
        post, comb, h = self.ffn_hc(streams)
        return hc_mix(streams, post, comb, self.mlp(self.post_attention_layernorm(h)))


class Glm5NextForConditionalGeneration(CausalLM):
    """The text path of `Glm5NextForConditionalGeneration` (and of a flat text folder)."""

    def __init__(self, config: ModelConfig) -> None:
        glm = config.glm5_next
        if glm is None or config.mla is None or config.linear_attention is None:
            raise ValueError("glm5_next needs its indexer, MLA and KDA configs")
        super().__init__(config)
        # The indexer's per-token key and gate score sit beside each MLA latent.
        self.cache_specs = tuple(
            LatentSpec(s.num_layers, s.width + 2 * glm.index_head_dim)
            if isinstance(s, LatentSpec)
            else s
            for s in self.cache_specs
        )
        layers = nn.ModuleList(
            Glm5NextLayer(config, i, slot, self.cache_specs[slot.group], kind)
            for i, (slot, kind) in enumerate(zip(self.slots, config.layer_types, strict=True))
        )
        self.model = Backbone(config, layers, RMSNorm(config.hidden_size, config.norm_eps))
        self.mult = glm.hc_mult

    def checkpoint_name(self, name: str) -> str | None:
        """The published names onto this model's; vision tower and MTP layer skipped."""
        if name.startswith(("model.visual.", "visual.")) or ".shared_head." in name:
            return None
        mapped = default_names(name)
        if mapped is None:
            return None
        layer = _LAYER.match(mapped)
        if layer and int(layer.group(1)) >= self.config.num_layers:
            return None  # the MTP layer (`layers.{num_hidden_layers}.*`)
        return rename_published(mapped)

    def forward(self, input_ids: torch.Tensor, ctx: StepContext) -> torch.Tensor:
        x = self.embed(input_ids)
        positions = self._grid_positions(ctx)
        streams = x[:, None, :].expand(-1, self.mult, -1).contiguous()
        for layer in self.model.layers:
            streams = layer(streams, ctx, positions)
        out: torch.Tensor = self.model.norm(streams.mean(dim=1))
        return out

    @staticmethod
    def _grid_positions(ctx: StepContext) -> np.ndarray:
        """Each row's query positions, in grid order [B, Q] (the indexer's causality)."""
        for batch in ctx.batches:
            if isinstance(batch, AttentionBatch):
                index = batch.query_index.cpu().numpy()
                return np.asarray(ctx.positions.cpu().numpy()[index])
        return np.zeros((0, 0), dtype=np.int64)
