"""The Llama-family forward pass on Triton kernels + cuBLAS matmuls (straight-line).

`forward_hidden` runs every layer over flat tokens and returns the final normed hidden states;
attention metadata arrives in `DecodeMeta` (one token per row, CUDA-graph safe) or
`PrefillMeta` (varlen chunks over a cached prefix). The KV arena is
`[num_pages, num_layers, 2, page_size, Hkv, D]`: one page holds a page of tokens of every layer,
so one plan page row addresses all layers.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from resin_models_cuda.config import ModelConfig
from resin_models_cuda.kernels import (
    apply_rope,
    decode_attention,
    fused_add_rmsnorm,
    kv_append,
    prefill_attention,
    rmsnorm,
    silu_and_mul,
)
from resin_models_cuda.moe import moe_forward
from resin_models_cuda.weights import LayerWeights, ModelWeights


@dataclass(frozen=True, slots=True)
class DecodeMeta:
    """Device tensors of a decode step: one query token per row (padding rows have
    `seq_lens == 0` and a slot of -1)."""

    page_indptr: torch.Tensor
    page_ids: torch.Tensor
    page_start: torch.Tensor
    seq_lens: torch.Tensor
    splits: int


@dataclass(frozen=True, slots=True)
class PrefillMeta:
    """Device tensors of a varlen step (chunks over cached prefixes)."""

    query_indptr: torch.Tensor
    cached_lens: torch.Tensor
    page_indptr: torch.Tensor
    page_ids: torch.Tensor
    page_start: torch.Tensor
    block_row: torch.Tensor
    block_off: torch.Tensor
    block_m: int


@dataclass(frozen=True, slots=True)
class StepTensors:
    input_ids: torch.Tensor  # int32 [T]
    positions: torch.Tensor  # int32 [T]
    slots: torch.Tensor  # int32 [T]
    meta: DecodeMeta | PrefillMeta


@dataclass(frozen=True, slots=True)
class Rope:
    cos: torch.Tensor
    sin: torch.Tensor


def _attention(
    config: ModelConfig,
    layer: LayerWeights,
    h: torch.Tensor,
    step: StepTensors,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    rope: Rope,
) -> torch.Tensor:
    tokens = h.shape[0]
    d = config.head_dim
    qkv = F.linear(h, layer.qkv, layer.qkv_bias)
    q = qkv[:, : config.q_size].view(tokens, config.num_heads, d)
    k = qkv[:, config.q_size : config.q_size + config.kv_size].view(tokens, config.num_kv_heads, d)
    v = qkv[:, config.q_size + config.kv_size :].view(tokens, config.num_kv_heads, d)
    if layer.q_norm is not None and layer.k_norm is not None:
        q = rmsnorm(q.reshape(-1, d), layer.q_norm, config.rms_norm_eps).view(tokens, -1, d)
        k = rmsnorm(k.reshape(-1, d), layer.k_norm, config.rms_norm_eps).view(tokens, -1, d)
    apply_rope(q, k, step.positions, rope.cos, rope.sin)
    kv_append(k, v, k_cache, v_cache, step.slots)
    scale = d**-0.5
    meta = step.meta
    if isinstance(meta, DecodeMeta):
        o = decode_attention(
            q, k_cache, v_cache, meta.page_indptr, meta.page_ids, meta.page_start,
            meta.seq_lens, scale=scale, splits=meta.splits, window=config.sliding_window,
        )  # fmt: skip
    else:
        o = prefill_attention(
            q, k_cache, v_cache, meta.query_indptr, meta.cached_lens, meta.page_indptr,
            meta.page_ids, meta.page_start, meta.block_row, meta.block_off, scale=scale,
            window=config.sliding_window, block_m=meta.block_m,
        )  # fmt: skip
    return F.linear(o.view(tokens, config.q_size), layer.o_proj)


def _mlp(config: ModelConfig, layer: LayerWeights, h: torch.Tensor) -> torch.Tensor:
    if layer.router is not None:
        return moe_forward(config, layer, h)
    return F.linear(silu_and_mul(F.linear(h, layer.gate_up)), layer.down)


def forward_hidden(
    config: ModelConfig,
    weights: ModelWeights,
    step: StepTensors,
    kv: torch.Tensor,
    rope: Rope,
) -> torch.Tensor:
    """All layers over `step`'s tokens; returns the final normed hidden states [T, H].

    The residual stream is kept apart from the sublayer outputs so that each norm fuses the
    preceding add (`fused_add_rmsnorm`): one read and one write per sublayer boundary.
    """
    residual = F.embedding(step.input_ids.long(), weights.embed)
    x = rmsnorm(residual, weights.layers[0].input_norm, config.rms_norm_eps)
    for i, layer in enumerate(weights.layers):
        if i > 0:
            fused_add_rmsnorm(x, residual, layer.input_norm, config.rms_norm_eps)
        x = _attention(config, layer, x, step, kv[:, i, 0], kv[:, i, 1], rope)
        fused_add_rmsnorm(x, residual, layer.post_norm, config.rms_norm_eps)
        x = _mlp(config, layer, x)
    fused_add_rmsnorm(x, residual, weights.final_norm, config.rms_norm_eps)
    return x


def compute_logits(weights: ModelWeights, hidden: torch.Tensor) -> torch.Tensor:
    """float32 logits [N, V] (the matmul in the weights' dtype, as Hugging Face does)."""
    return F.linear(hidden, weights.lm_head).float()
