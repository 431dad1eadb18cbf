"""Paged self-attention as a layer: fused qkv projection (optional bias), q/k RMS norm per
head or over the whole width, rotary, KV append into this layer's cache group, paged decode or
prefill attention (full, sliding window, attention sinks), output projection (both projections
through `quantized.linear`: FP8 where the checkpoint stores them so). The KV append
runs inside the rotary kernel (`fuse_append`, one launch fewer per layer)."""

from __future__ import annotations

import torch

from resin_model.config import ModelConfig
from resin_models_cuda.kernels import PagedKV, decode_attention, kv_append, prefill_attention
from resin_models_cuda.layers.norm import RMSNorm
from resin_models_cuda.layers.quantized import linear
from resin_models_cuda.layers.rotary import Rotary
from resin_models_cuda.layers.weights import WeightSource
from resin_models_cuda.step import DecodeInfo, LayerSlot, StepTensors


def _fused(
    w: WeightSource, names: list[str], shapes: list[tuple[int, ...]], init: str = "normal"
) -> torch.Tensor:
    return torch.cat([w.get(n, s, init) for n, s in zip(names, shapes, strict=True)])


class Attention:
    """`prefix` is the layer's `...self_attn.`; `window` 0 = full attention."""

    def __init__(
        self,
        config: ModelConfig,
        w: WeightSource,
        prefix: str,
        slot: LayerSlot,
        window: int,
        rotary: Rotary,
        unit_offset_norms: bool = False,
    ) -> None:
        if config.attn_logit_softcapping is not None:
            raise ValueError("attention logit soft-capping is not supported by the fast runner")
        c, h, d = config, config.hidden_size, config.head_dim
        self.config, self.slot, self.window, self.rotary = c, slot, window, rotary
        self.q_size, self.kv_size, self.scale = c.q_size, c.kv_size, c.scale
        sizes: list[tuple[int, ...]] = [(c.q_size, h), (c.kv_size, h), (c.kv_size, h)]
        names = [f"{prefix}{p}_proj.weight" for p in "qkv"]
        qkv_bias = None
        if c.qkv_bias:
            biases = [f"{prefix}{p}_proj.bias" for p in "qkv"]
            qkv_bias = _fused(w, biases, [(s[0],) for s in sizes])
        self.qkv = linear(w, names, [(c.q_size, h), (c.kv_size, h), (c.kv_size, h)], bias=qkv_bias)
        o_bias = w.get(f"{prefix}o_proj.bias", (h,)) if c.o_bias else None
        self.o_proj = linear(w, [f"{prefix}o_proj.weight"], [(h, c.q_size)], "out", o_bias)
        self.q_norm = self.k_norm = None
        if c.qk_norm:
            qw, kw = (d, d) if c.qk_norm_per_head else (c.q_size, c.kv_size)
            self.q_norm = RMSNorm(w, f"{prefix}q_norm.weight", qw, c.norm_eps, unit_offset_norms)
            self.k_norm = RMSNorm(w, f"{prefix}k_norm.weight", kw, c.norm_eps, unit_offset_norms)
        self.sinks = w.get(f"{prefix}sinks", (c.num_heads,)).float() if c.sinks else None
        self.fuse_append = True  # KV append inside the rotary kernel (False: its own launch)

    def __call__(self, x: torch.Tensor, step: StepTensors, kv: torch.Tensor) -> torch.Tensor:
        t, d = x.shape[0], self.config.head_dim
        qkv = self.qkv(x)
        qs, ks = self.q_size, self.kv_size
        q, k = qkv[:, :qs], qkv[:, qs : qs + ks]
        v = qkv[:, qs + ks :].view(t, -1, d)
        group = step.groups[self.slot.group]
        k_cache, v_cache = kv[:, self.slot.index, 0], kv[:, self.slot.index, 1]
        append = (v, k_cache, v_cache, group.slots) if self.fuse_append else None
        if self.q_norm is not None and self.k_norm is not None and self.config.qk_norm_per_head:
            q, k = q.view(t, -1, d), k.view(t, -1, d)
            self.rotary(q, k, step.positions, (self.q_norm, self.k_norm), append)
        else:
            if self.q_norm is not None and self.k_norm is not None:  # whole-width (OLMo 2)
                q, k = self.q_norm(q), self.k_norm(k)
            q, k = q.view(t, -1, d), k.view(t, -1, d)
            self.rotary(q, k, step.positions, append=append)
        if append is None:
            kv_append(k, v, k_cache, v_cache, group.slots)
        pages = PagedKV(k_cache, v_cache, group.page_indptr, group.page_ids, group.page_start)
        info = step.info
        if isinstance(info, DecodeInfo):
            o = decode_attention(
                q, pages, info.seq_lens, scale=self.scale, splits=info.splits,
                window=self.window, sinks=self.sinks, query=info.query, q_lens=info.q_lens,
            )  # fmt: skip
        else:
            o = prefill_attention(
                q, pages, info.query_indptr, info.cached_lens, info.block_row, info.block_off,
                scale=self.scale, window=self.window, sinks=self.sinks, span_end=info.span_end,
                block_m=info.block_m,
            )  # fmt: skip
        return self.o_proj(o.view(t, qs))
