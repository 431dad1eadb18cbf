"""DeepSeek V2 / V2-Lite / V3 (R1): multi-head latent attention (`mla.py`, a latent cache
group), the first `first_k_dense_replace` layers dense, the rest a routed MoE with shared
experts and grouped routing, and the multi-token-prediction (MTP) layers a checkpoint may carry
beyond `num_hidden_layers` (`model.layers.{N+k}.*`, loaded into `mtp`, run by `mtp_step`).

Routing (`DeepseekRouter`): scores are a softmax (V2) or a sigmoid (V3) of the fp32 router
logits; V3 adds `e_score_correction_bias` to choose experts but weighs them by the unbiased
scores. With groups, a token keeps its best `topk_groups` groups first. Weights are optionally
renormalised over the chosen k, then multiplied by `routed_scale`.
"""

from __future__ import annotations

from dataclasses import replace

import torch
import torch.nn.functional as F
from torch import nn

from resin_model.config import ModelConfig, MoeConfig
from resin_model.expert_routing import deepseek_route
from resin_model.nn import RMSNorm
from resin_models_torch.base import Backbone, CausalLM
from resin_models_torch.batch import CacheSpec, LatentSpec, LayerSlot, StepContext
from resin_models_torch.layers import Float32Module, GatedMLP, Rotary
from resin_models_torch.mla import MlaAttention


class DeepseekRouter(Float32Module):
    """`mlp.gate`: weight [E, hidden] and (V3) `e_score_correction_bias` [E], float32 in a
    model of any dtype; logits in float32."""

    def __init__(self, hidden: int, moe: MoeConfig) -> None:
        super().__init__()
        self.moe = moe
        self.weight = nn.Parameter(torch.empty(moe.num_experts, hidden))
        self.e_score_correction_bias: nn.Parameter | None = None
        if moe.score_bias:
            self.e_score_correction_bias = nn.Parameter(torch.zeros(moe.num_experts))

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """x [T, hidden] -> (weights [T, k] float32, chosen expert ids [T, k])."""
        logits = F.linear(x.float(), self.weight.float())
        return deepseek_route(logits, self.e_score_correction_bias, self.moe)


class DeepseekMoe(nn.Module):
    """Routed experts plus always-on shared experts (one MLP of n_shared x moe width)."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        moe = config.moe
        assert moe is not None
        hidden, act = config.hidden_size, config.hidden_act
        self.gate = DeepseekRouter(hidden, moe)
        self.experts = nn.ModuleList(
            GatedMLP(hidden, moe.intermediate_size, act) for _ in range(moe.num_experts)
        )
        self.shared_experts: GatedMLP | None = None
        if moe.shared_intermediate_size:
            self.shared_experts = GatedMLP(hidden, moe.shared_intermediate_size, act)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        weights, chosen = self.gate(x)
        out = torch.zeros_like(x)
        # One pass per expert that received tokens; the routing decides the work, not the batch.
        for expert_id in torch.unique(chosen).tolist():
            token_idx, slot = torch.where(chosen == expert_id)
            y = self.experts[expert_id](x[token_idx]) * weights[token_idx, slot, None]
            out.index_add_(0, token_idx, y.to(x.dtype))
        if self.shared_experts is not None:
            out = out + self.shared_experts(x)
        return out


class DeepseekLayer(nn.Module):
    def __init__(self, config: ModelConfig, sparse: bool, slot: LayerSlot) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(config.hidden_size, config.norm_eps)
        self.self_attn = MlaAttention(config, slot)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.norm_eps)
        self.mlp: nn.Module = (
            DeepseekMoe(config)
            if sparse
            else GatedMLP(config.hidden_size, config.intermediate_size, config.hidden_act)
        )

    def forward(
        self, x: torch.Tensor, ctx: StepContext, cos: torch.Tensor, sin: torch.Tensor
    ) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x), ctx, cos, sin)
        out: torch.Tensor = x + self.mlp(self.post_attention_layernorm(x))
        return out


class SharedHead(nn.Module):
    """`shared_head.norm` of an MTP layer (its `head` duplicates the LM head: not loaded)."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.norm = RMSNorm(config.hidden_size, config.norm_eps)


class MtpLayer(DeepseekLayer):
    """One MTP module (DeepSeek-V3 paper, section 2.2): combines the embedding of token i+1
    with the hidden state that predicted it, `eh_proj([enorm(emb) ; hnorm(h)])`, runs a full
    decoder layer (MoE, its own cache layer), and `shared_head.norm` gives the hidden state
    whose LM-head logits predict token i+2."""

    def __init__(self, config: ModelConfig, slot: LayerSlot) -> None:
        super().__init__(config, True, slot)  # MTP layers always use the MoE
        hidden = config.hidden_size
        self.enorm = RMSNorm(hidden, config.norm_eps)
        self.hnorm = RMSNorm(hidden, config.norm_eps)
        self.eh_proj = nn.Linear(2 * hidden, hidden, bias=False)
        self.shared_head = SharedHead(config)

    def draft(
        self,
        embeds: torch.Tensor,
        previous: torch.Tensor,
        ctx: StepContext,
        cos: torch.Tensor,
        sin: torch.Tensor,
    ) -> torch.Tensor:
        x = self.eh_proj(torch.cat((self.enorm(embeds), self.hnorm(previous)), dim=-1))
        out: torch.Tensor = self.shared_head.norm(self(x, ctx, cos, sin))
        return out


class DeepseekForCausalLM(CausalLM):
    """`model.layers[:N]` is the decoder; `model.layers[N:]` are the checkpoint's MTP layers
    (`num_nextn_predict_layers`), which `forward` never runs."""

    def __init__(self, config: ModelConfig) -> None:
        if config.mla is None or config.moe is None:
            raise ValueError("deepseek models need MLA and MoE configs")
        super().__init__(config)
        n = config.num_layers
        layers: list[nn.Module] = [
            DeepseekLayer(config, config.is_sparse(i), self.slots[i]) for i in range(n)
        ]
        # An MTP layer caches its latents as one more layer of the group (`MtpRunner` declares
        # those layers; a plain TorchRunner never runs them).
        group = self.slots[0].group
        layers += [MtpLayer(config, LayerSlot(group, n + k)) for k in range(config.num_mtp_layers)]
        self.model = Backbone(
            config, nn.ModuleList(layers), RMSNorm(config.hidden_size, config.norm_eps)
        )
        self.rotary = Rotary(config.rope, config.mla.rope_dim)

    def checkpoint_name(self, name: str) -> str | None:
        # MTP layers keep copies of the embedding and LM head; the model's own are used.
        n = self.config.num_layers
        for k in range(self.config.num_mtp_layers):
            if name in (f"model.layers.{n + k}.embed_tokens.weight",
                        f"model.layers.{n + k}.shared_head.head.weight"):  # fmt: skip
                return None
        return super().checkpoint_name(name)

    @property
    def mtp(self) -> list[MtpLayer]:
        return [m for m in self.model.layers if isinstance(m, MtpLayer)]

    def forward(self, input_ids: torch.Tensor, ctx: StepContext) -> torch.Tensor:
        x = self.embed(input_ids)
        cos, sin = self.rotary.cos_sin(ctx.positions)
        for layer in self.model.layers[: self.config.num_layers]:
            x = layer(x, ctx, cos, sin)
        out: torch.Tensor = self.model.norm(x)
        return out

    def drafting_specs(self, num_drafts: int) -> tuple[CacheSpec, ...]:
        """The latent group with the MTP layers as more layers of it."""
        (spec,) = self.cache_specs
        assert isinstance(spec, LatentSpec)
        layers = self.config.num_layers + len(self.mtp)
        return (replace(spec, num_layers=layers),)

    def draft_source(self, hidden: torch.Tensor) -> torch.Tensor:
        """What an MTP layer pairs token i + 1 with: the final hidden state at i."""
        return hidden

    def mtp_step(
        self, depth: int, ids: torch.Tensor, previous: torch.Tensor, ctx: StepContext
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """MTP layer `depth` on (token i, final hidden state at i-1) pairs at the positions i
        of `ctx` (writing its cache layer where the plan appends): returns [T, hidden] whose
        `logits` predict token i+1 (a draft one past the main model's), twice: it is also
        what a chained draft pairs with."""
        cos, sin = self.rotary.cos_sin(ctx.positions)
        out = self.mtp[depth].draft(self.embed(ids), previous, ctx, cos, sin)
        return out, out
