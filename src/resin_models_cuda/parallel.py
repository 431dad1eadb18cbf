"""Tensor and expert parallelism for the fast models, applied after the model is built.

gpt-fast style: every rank builds (or loads) the whole model, then `shard_model` cuts this
rank's slices out of the built layers (`layers/parallel.py`) and adds the collectives. Every
rank of the model group runs the same step on the same plan (`resin.backend` broadcasts it);
the result is the unsharded model's up to the order of float sums.

What is split how over the `size` ranks of the group (`ParallelStyle()`):

| part | split | collective |
|---|---|---|
| q/k/v (fused) | column-parallel by heads: query and KV heads `[r H/size, (r+1) H/size)` | none |
| o_proj | row-parallel, bias on rank 0 | one all-reduce |
| MLA (DeepSeek) | q, `kv_b`, `W_uk`, `W_uv` by heads; latents replicated | one all-reduce |
| dense MLP | `[gate; up]` column-parallel, down row-parallel | one all-reduce |
| MoE, `experts="tensor"` | every expert (shared ones too) split like a dense MLP | one all-reduce |
| MoE, `experts="expert"` | runs of whole experts; shared experts on rank 0 | one all-reduce |
| embedding | vocab-parallel: ids `[r ceil(V/size), ...)`, others embed to zero | one all-reduce |
| LM head | the same vocabulary rows; logits all-gathered to [N, V] | one all-gather |
| norms, rotary, routers, MTP `eh_proj` | replicated | none |

Each rank's KV arena holds its KV heads (`cache_token_shape`); an MLA model's latents are
per token, so every rank caches all of them (attention data parallelism, which would split
the sequences instead, is not built). `ParallelStyle(tensor=False, experts="expert")` keeps
attention, dense MLPs and the vocabulary replicated and spreads only the experts.

DeepSeek-V4 and GLM-5.3 have no split plan for their attention (V4: one shared K=V head, the
compressors and the indexer; GLM: KDA and the indexed MLA): they shard only with
`tensor=False`, attention, mHC, dense MLPs and the vocabulary replicated, every rank running
every token, and the experts spread (or split) as above with the one all-reduce per MoE
layer. V4's hash layers route by the global expert ids of their token table, then relabel
like the top-k layers; its shared expert rides in the stack on rank 0, or (beside FP4
experts, no common format) runs as its own MLP on rank 0 before the all-reduce.

The embedding and head are the model's own methods: `shard_model` moves the built model into
a subclass of its class (`TensorParallelModel` first), as `torch.nn.utils.parametrize` does
with modules, so the model file's straight-line `forward` stays as written.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

import torch
import torch.distributed as dist
import torch.nn.functional as F

from resin_models_cuda.kernels.moe_mxfp4 import Mxfp4Experts
from resin_models_cuda.layers import Attention, GatedMLP, MoE
from resin_models_cuda.layers.mla import MlaAttention
from resin_models_cuda.layers.parallel import (
    Group,
    ParallelMoE,
    RowParallelLinear,
    RowParallelMla,
    Shard,
    column_parallel,
    own,
)
from resin_models_cuda.models.base import FastModel
from resin_models_cuda.models.deepseek_v4 import DeepseekV4, V4Moe
from resin_models_cuda.models.glm5_next import Glm5Next
from resin_models_cuda.step import MediaTensors


@dataclass(frozen=True, slots=True)
class ParallelStyle:
    """`tensor`: split attention, dense MLPs, embedding and LM head by the group (else they
    are replicated); `experts`: split every expert ("tensor") or spread whole experts over
    the ranks ("expert", expert parallelism)."""

    tensor: bool = True
    experts: Literal["tensor", "expert"] = "tensor"


def shard_model(model: FastModel, group: Group, style: ParallelStyle | None = None) -> FastModel:
    """Cut this rank's shard out of the built `model` (in place) and return it.

    Raises `ValueError`, before anything is cut, for a layer or shape that does not split
    evenly over the group."""
    style = style or ParallelStyle()
    rank, size = dist.get_rank(group), dist.get_world_size(group)
    if size == 1:
        return model
    check_shardable(model, size, style)
    shard = Shard(rank, size, group)
    expert_parallel = style.experts == "expert"
    for layer in _layers(model):
        if isinstance(model, REPLICATED_ATTENTION):  # layers cut while loading stay as they are
            if isinstance(getattr(layer, "moe", None), V4Moe):
                if not isinstance(layer.moe.moe, ParallelMoE):
                    layer.moe = parallel_v4_moe(layer.moe, shard, expert_parallel)
            elif isinstance(layer.mlp, MoE) and not isinstance(layer.mlp, ParallelMoE):
                layer.mlp = ParallelMoE(layer.mlp, shard, expert_parallel)
            continue
        if style.tensor:
            if isinstance(layer.attn, MlaAttention):
                layer.attn = RowParallelMla(layer.attn, shard)
            else:
                _split_attention(layer.attn, shard)
        if isinstance(layer.mlp, MoE):
            layer.mlp = ParallelMoE(layer.mlp, shard, expert_parallel)
        elif style.tensor:
            inner = layer.mlp.gate_up.out_features // 2
            layer.mlp.gate_up = column_parallel(layer.mlp.gate_up, [inner, inner], shard)
            layer.mlp.down = RowParallelLinear(layer.mlp.down, shard)
    if style.tensor:
        _vocab_parallel(model, shard)
    return model


def check_shardable(model: FastModel, size: int, style: ParallelStyle) -> None:
    """Raise `ValueError` unless every layer of `model` splits evenly over `size` ranks."""
    config = model.config
    if isinstance(model, REPLICATED_ATTENTION):
        if style.tensor:
            raise ValueError(
                f"{config.model_type}: its attention has no tensor-parallel plan; shard its "
                "experts alone (ParallelStyle(tensor=False), --replicated-attention)"
            )
        for layer in _layers(model):
            moe = layer.moe.moe if isinstance(getattr(layer, "moe", None), V4Moe) else layer.mlp
            if isinstance(moe, MoE) and not isinstance(moe, ParallelMoE):
                _check_moe(moe, size, style)
        return
    if style.tensor and config.vocab_size < size:
        raise ValueError(f"a vocabulary of {config.vocab_size} does not split over {size} ranks")
    for layer in _layers(model):
        attn, mlp = getattr(layer, "attn", None), getattr(layer, "mlp", None)
        if not isinstance(attn, Attention | MlaAttention) or not isinstance(mlp, GatedMLP | MoE):
            kind = f"{type(layer).__name__} ({type(attn).__name__}, {type(mlp).__name__})"
            raise ValueError(f"{config.model_type}: no parallel plan for the layer {kind}")
        if style.tensor:
            _check_attention(attn, size)
            if isinstance(mlp, GatedMLP):
                _divides(mlp.gate_up.out_features // 2, size, "the MLP width")
        if isinstance(mlp, MoE):
            _check_moe(mlp, size, style)


REPLICATED_ATTENTION = (DeepseekV4, Glm5Next)
"""The models whose attention every rank runs whole (only their experts are cut)."""


def parallel_v4_moe(built: V4Moe, shard: Shard, expert_parallel: bool) -> V4Moe:
    """A copy of DeepSeek-V4's MoE layer over this rank's experts (`ParallelMoE`); a shared
    expert kept beside the stack is added on rank 0, before the all-reduce."""
    cut = copy.copy(built)
    extra = built.shared if shard.rank == 0 else None
    cut.moe, cut.shared = ParallelMoE(built.moe, shard, expert_parallel, extra), None
    return cut


def moe_cutter(group: Group, style: ParallelStyle) -> Callable[[Any], Any] | None:
    """`BuildOptions.cut_moe` for `style` over `group`: DeepSeek-V4's and GLM-5.3's MoE
    layers cut for this rank as they are built (`shard_model` then leaves them as they are), so
    the build never holds every layer's experts; None for one rank or `style.tensor` (no
    build-time cut for those plans)."""
    size = dist.get_world_size(group)
    if size == 1 or style.tensor:
        return None
    shard = Shard(dist.get_rank(group), size, group)
    expert_parallel = style.experts == "expert"

    def cut(layer: Any) -> Any:
        if isinstance(layer, V4Moe):
            return parallel_v4_moe(layer, shard, expert_parallel)
        if style.experts == "tensor":
            _check_moe(layer, size, style)
        return ParallelMoE(layer, shard, expert_parallel)

    return cut


def _layers(model: FastModel) -> list[Any]:
    """The decoder layers to cut, the MTP layer's included (DeepSeek)."""
    layers = list(getattr(model, "layers", []))
    mtp = getattr(model, "mtp", None)
    return layers if mtp is None else [*layers, mtp.layer]


def _divides(value: int, size: int, what: str) -> None:
    if value % size:
        raise ValueError(f"{what} ({value}) does not split evenly over {size} ranks")


def _check_attention(attn: Attention | MlaAttention, size: int) -> None:
    if isinstance(attn, MlaAttention):
        _divides(attn.heads, size, "the attention heads")
        return
    config = attn.config
    if attn.q_norm is not None and not config.qk_norm_per_head:
        raise ValueError("a q/k norm over all heads at once (OLMo 2) cannot be split by heads")
    _divides(config.num_heads, size, "the attention heads")
    _divides(config.num_kv_heads, size, "the KV heads")


def _check_moe(mlp: MoE, size: int, style: ParallelStyle) -> None:
    if style.experts == "expert":
        if mlp.moe.num_experts < size:
            raise ValueError(f"{mlp.moe.num_experts} experts do not spread over {size} ranks")
        return
    _divides(mlp.moe.intermediate_size, size, "the expert width")
    if isinstance(mlp.w.down, Mxfp4Experts):
        groups = mlp.w.down.scales.shape[2]
        _divides(groups, size, "the expert width in MXFP4 groups of 32")


def _split_attention(attn: Attention, shard: Shard) -> None:
    """Column-parallel `[q; k; v]` by heads, row-parallel `o_proj`, this rank's sinks."""
    q, kv = attn.q_size, attn.kv_size
    attn.qkv = column_parallel(attn.qkv, [q, kv, kv], shard)
    attn.q_size, attn.kv_size = q // shard.size, kv // shard.size
    attn.o_proj = RowParallelLinear(attn.o_proj, shard)
    if attn.sinks is not None:
        start, length = shard.run(attn.sinks.shape[0])
        attn.sinks = own(attn.sinks.narrow(0, start, length))


def _vocab_parallel(model: FastModel, shard: Shard) -> None:
    """Keep this rank's vocabulary rows of the embedding and LM head (one tensor if tied)."""
    vocab = model.config.vocab_size
    width = -(-vocab // shard.size)
    start = min(shard.rank * width, vocab)
    stop = min(start + width, vocab)
    tied = model.lm_head is model.embed
    model.embed = own(model.embed[start:stop])
    model.lm_head = model.embed if tied else own(model.lm_head[start:stop])
    model.__class__ = _tensor_parallel(type(model))
    assert isinstance(model, TensorParallelModel)
    model.shard, model.vocab_start, model.vocab_width = shard, start, width


class TensorParallelModel(FastModel):
    """What a tensor-parallel model overrides of its class (see the module docstring): the
    vocab-parallel embedding and LM head, and the KV heads one rank caches."""

    shard: Shard
    vocab_start: int
    vocab_width: int  # ceil(V / size): every rank's share, the last one padded

    def embed_tokens(
        self, input_ids: torch.Tensor, media: MediaTensors | None = None
    ) -> torch.Tensor:
        rows = self.embed.shape[0]
        local = input_ids.long() - self.vocab_start
        inside = (local >= 0) & (local < rows)
        x = F.embedding(local.clamp(0, rows - 1), self.embed) * inside[:, None].to(self.dtype)
        dist.all_reduce(x, group=self.shard.group)  # one rank adds each row, the rest zeros
        if self.config.embed_scale != 1.0:
            x = x * torch.tensor(self.config.embed_scale, dtype=x.dtype)
        if media is not None:
            x.index_copy_(0, media.token_index, media.features.to(x.dtype))
        return x

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        local = super().logits(hidden)  # [N, this rank's ids] float32
        if local.shape[1] < self.vocab_width:
            local = F.pad(local, (0, self.vocab_width - local.shape[1]))
        parts = [torch.empty_like(local) for _ in range(self.shard.size)]
        dist.all_gather(parts, local.contiguous(), group=self.shard.group)
        return torch.cat(parts, dim=1)[:, : self.config.vocab_size]

    def cache_token_shape(self) -> tuple[int, int, int]:
        planes, heads, dim = super().cache_token_shape()
        if self.config.mla is not None:  # one latent per token, whatever the heads
            return planes, heads, dim
        return planes, heads // self.shard.size, dim


def _tensor_parallel(cls: type[FastModel]) -> type[FastModel]:
    """One subclass per model class, `TensorParallelModel`'s methods first."""
    if cls not in _SUBCLASSES:
        _SUBCLASSES[cls] = type(f"TensorParallel{cls.__name__}", (TensorParallelModel, cls), {})
    return _SUBCLASSES[cls]


_SUBCLASSES: dict[type[FastModel], type[FastModel]] = {}
