"""Tensor and expert parallelism for the reference models, applied after the model is built.

gpt-fast style: build (or load) the whole model on every rank, then `shard_model` cuts each
rank's slice out of the built modules and adds the collectives. Every rank of `group` runs the
same step on the same tokens; the result is the unsharded model's, up to float rounding.

What is sharded how (tensor parallel, `size` ranks of `group`):
- attention: q/k/v column-parallel by heads (rank r keeps query heads and KV heads
  [r*H/size, (r+1)*H/size)); o_proj row-parallel + one all-reduce. Each rank's KV cache holds
  only its KV heads: `cache_specs` is rewritten so the runner sizes its arena for them.
- dense MLP: gate/up column-parallel, down row-parallel + one all-reduce.
- MoE experts, `experts="tensor"`: every expert's gate/up/down split like a dense MLP, one
  all-reduce per MoE layer; `experts="expert"`: whole experts split across ranks (expert
  parallel), each rank runs only its experts on every routed token, one all-reduce combines.
  The router is replicated.
- embedding: vocab-parallel (rank r holds a contiguous id range; out-of-range ids give zeros;
  one all-reduce). LM head: vocab-parallel rows, logits all-gathered to the full vocabulary.
- norms, rotary: replicated.

A row-parallel bias is kept on rank 0 only, so the all-reduce adds it once.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any, Literal

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from resin_models_torch.base import CausalLM
from resin_models_torch.batch import KvSpec, StepContext
from resin_models_torch.layers import GatedMLP, SparseMoe
from resin_models_torch.llama import LlamaAttention, LlamaLayer

Group = dist.ProcessGroup | None


@dataclass(frozen=True, slots=True)
class ParallelStyle:
    """How a model is split over the ranks of one group.

    `tensor`: shard attention, dense MLPs, embedding and LM head (else they are replicated, as
    with expert parallelism over data-parallel attention). `experts`: split every expert
    ("tensor") or the set of experts ("expert").
    """

    tensor: bool = True
    experts: Literal["tensor", "expert"] = "tensor"


def shard_model(model: CausalLM, group: Group, style: ParallelStyle | None = None) -> CausalLM:
    """Cut this rank's shard out of `model` (in place) and return the model to run.

    Raises `ValueError` for an architecture or shape that cannot be split evenly.
    """
    style = style or ParallelStyle()
    rank, size = dist.get_rank(group), dist.get_world_size(group)
    if size == 1:
        return model
    check_shardable(model, size, style)
    for layer in model.model.layers:
        assert isinstance(layer, LlamaLayer)
        if style.tensor:
            _shard_attention(layer.self_attn, rank, size, group)
        mlp = layer.mlp
        if isinstance(mlp, SparseMoe):
            if style.experts == "expert":
                layer.mlp = ExpertParallelMoe(mlp, rank, size, group)
            else:
                for expert in mlp.experts:
                    assert isinstance(expert, GatedMLP)
                    _shard_mlp(expert, rank, size)
                mlp.register_forward_hook(_all_reduce_hook(group))
        elif style.tensor:
            assert isinstance(mlp, GatedMLP)
            _shard_mlp(mlp, rank, size)
            mlp.register_forward_hook(_all_reduce_hook(group))
    if not style.tensor:
        return model
    model.cache_specs = tuple(
        replace(s, num_kv_heads=s.num_kv_heads // size) if isinstance(s, KvSpec) else s
        for s in model.cache_specs
    )
    return VocabParallelLM(model, rank, size, group)


def check_shardable(model: CausalLM, size: int, style: ParallelStyle) -> None:
    """Raise `ValueError` unless `model` splits evenly over `size` ranks in `style`."""
    config = model.config
    for layer in model.model.layers:
        if not isinstance(layer, LlamaLayer) or not isinstance(layer.mlp, GatedMLP | SparseMoe):
            raise ValueError(f"no parallel plan for model_type {config.model_type!r} yet")
    if not style.tensor:
        return
    if config.num_kv_heads % size:
        raise ValueError(f"{config.num_kv_heads} KV heads do not split over {size} ranks")
    if config.intermediate_size % size:
        raise ValueError(f"intermediate_size {config.intermediate_size} is not divisible by {size}")
    for layer in model.model.layers:
        assert isinstance(layer, LlamaLayer)
        norm = layer.self_attn.q_norm
        if norm is not None and norm.weight.shape[0] != config.head_dim:
            raise ValueError("a q/k norm over all heads at once cannot be split by heads")
    moe = config.moe
    if moe is not None and style.experts == "tensor" and moe.intermediate_size % size:
        raise ValueError(
            f"moe_intermediate_size {moe.intermediate_size} is not divisible by {size}"
        )


def _shard_attention(attn: LlamaAttention, rank: int, size: int, group: Group) -> None:
    _keep_rows(attn.q_proj, rank, size)
    _keep_rows(attn.k_proj, rank, size)
    _keep_rows(attn.v_proj, rank, size)
    _keep_columns(attn.o_proj, rank, size)
    sinks = getattr(attn, "sinks", None)  # a per-head parameter on models that have one
    if isinstance(sinks, nn.Parameter):
        attn.sinks = _slice(sinks, 0, rank, size)
    attn.o_proj.register_forward_hook(_all_reduce_hook(group))


def _shard_mlp(mlp: GatedMLP, rank: int, size: int) -> None:
    _keep_rows(mlp.gate_proj, rank, size)
    _keep_rows(mlp.up_proj, rank, size)
    _keep_columns(mlp.down_proj, rank, size)


def _slice(param: torch.Tensor, dim: int, rank: int, size: int) -> nn.Parameter:
    part = param.shape[dim] // size
    piece = param.detach().narrow(dim, rank * part, part).clone()
    return nn.Parameter(piece, requires_grad=False)


def _keep_rows(linear: nn.Linear, rank: int, size: int) -> None:
    """Column-parallel: keep this rank's output features (and their bias)."""
    linear.weight = _slice(linear.weight, 0, rank, size)
    if linear.bias is not None:
        linear.bias = _slice(linear.bias, 0, rank, size)
    linear.out_features = linear.weight.shape[0]


def _keep_columns(linear: nn.Linear, rank: int, size: int) -> None:
    """Row-parallel: keep this rank's input features; the bias stays on rank 0 only."""
    linear.weight = _slice(linear.weight, 1, rank, size)
    if linear.bias is not None and rank != 0:
        linear.register_parameter("bias", None)
    linear.in_features = linear.weight.shape[1]


def _all_reduce_hook(group: Group) -> Callable[[nn.Module, Any, torch.Tensor], torch.Tensor]:
    def hook(module: nn.Module, args: Any, output: torch.Tensor) -> torch.Tensor:
        dist.all_reduce(output, group=group)
        return output

    return hook


class ExpertParallelMoe(nn.Module):
    """`SparseMoe` with only this rank's experts: routing is computed on every rank (the router
    is replicated), each rank applies its experts to the tokens routed to them, and one
    all-reduce adds the partial outputs. Experts are split into contiguous, nearly equal runs."""

    def __init__(self, moe: SparseMoe, rank: int, size: int, group: Group) -> None:
        super().__init__()
        total = len(moe.experts)
        bounds = [total * r // size for r in range(size + 1)]
        self.first, self.last = bounds[rank], bounds[rank + 1]
        self.top_k, self.norm_topk, self.group = moe.top_k, moe.norm_topk, group
        self.gate = moe.gate
        self.experts = nn.ModuleList(moe.experts[self.first : self.last])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        probs = torch.softmax(self.gate(x), dim=-1, dtype=torch.float32)
        weights, chosen = torch.topk(probs, self.top_k, dim=-1)
        if self.norm_topk:
            weights = weights / weights.sum(dim=-1, keepdim=True)
        weights = weights.to(x.dtype)
        out = torch.zeros_like(x)
        mine = chosen[(chosen >= self.first) & (chosen < self.last)]
        for expert_id in torch.unique(mine).tolist():
            token_idx, slot = torch.where(chosen == expert_id)
            y = self.experts[expert_id - self.first](x[token_idx]) * weights[token_idx, slot, None]
            out.index_add_(0, token_idx, y)
        dist.all_reduce(out, group=self.group)
        return out


class VocabParallelEmbedding(nn.Module):
    """Rows [start, start + n) of the embedding; other ids embed to zeros; one all-reduce."""

    def __init__(self, weight: torch.Tensor, start: int, group: Group) -> None:
        super().__init__()
        self.weight = nn.Parameter(weight, requires_grad=False)
        self.start, self.group = start, group

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        rows = self.weight.shape[0]
        local = input_ids - self.start
        inside = (local >= 0) & (local < rows)
        out = F.embedding(local.clamp(0, max(rows - 1, 0)), self.weight) if rows else None
        if out is None:
            out = self.weight.new_zeros(input_ids.shape[0], self.weight.shape[1])
        out = out * inside[:, None].to(out.dtype)
        dist.all_reduce(out, group=self.group)
        return out


class VocabParallelLM(CausalLM):
    """A tensor-parallel model: the wrapped model with a vocab-parallel embedding and LM head.

    The vocabulary is cut into `size` contiguous shards of ceil(V / size) ids (the last may be
    shorter); `logits` all-gathers the shards, so every rank returns full [N, V] logits.
    """

    def __init__(self, inner: CausalLM, rank: int, size: int, group: Group) -> None:
        nn.Module.__init__(self)  # the parts are inner's; CausalLM.__init__ would build new ones
        vocab = inner.config.vocab_size
        self.shard = -(-vocab // size)
        start = min(rank * self.shard, vocab)
        stop = min(start + self.shard, vocab)
        embed = inner.model.embed_tokens.weight.detach()[start:stop].clone()
        inner.model.embed_tokens = VocabParallelEmbedding(embed, start, group)  # type: ignore[assignment]
        if inner.lm_head is not None:
            inner.lm_head.weight = nn.Parameter(
                inner.lm_head.weight.detach()[start:stop].clone(), requires_grad=False
            )
            inner.lm_head.out_features = stop - start
        self.inner, self.group, self.size = inner, group, size
        self.config, self.model, self.lm_head = inner.config, inner.model, inner.lm_head
        self.cache_specs, self.slots = inner.cache_specs, inner.slots
        self.layer_groups = inner.layer_groups

    def forward(self, input_ids: torch.Tensor, ctx: StepContext) -> torch.Tensor:
        out: torch.Tensor = self.inner(input_ids, ctx)
        return out

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        local = self.inner.logits(hidden)  # [N, this rank's ids] float32
        if local.shape[1] < self.shard:
            local = F.pad(local, (0, self.shard - local.shape[1]))
        parts = [torch.empty_like(local) for _ in range(self.size)]
        dist.all_gather(parts, local.contiguous(), group=self.group)
        return torch.cat(parts, dim=1)[:, : self.config.vocab_size]
