"""Shared building blocks of the reference models: rotary embeddings, MLPs, MoE, and the paged
attention / short-conv operators that read and write the engine's cache through a step's
`StepContext` (see `batch.py`). The RMS norm and the activations are `resin_model.nn`'s (the
vision tower shared with the fast runners uses them too).

Shapes: T = flat query tokens of the step, H = heads, D = head dim.
"""

from __future__ import annotations

from typing import TypeVar

import torch
import torch.nn.functional as F
from torch import nn

from resin_model.config import RopeConfig
from resin_model.nn import activation
from resin_models_torch.batch import AttentionBatch, StateBatch

ModuleT = TypeVar("ModuleT", bound=nn.Module)


class Float32Module(nn.Module):
    """A module whose parameters stay float32 in a model of any dtype: DeepSeek-style routers
    (`gate.weight`, `e_score_correction_bias`), as transformers keeps them, so a checkpoint's
    float32 bias is never rounded and the expert choice is transformers' (`keep_float32`
    casts them back after the model's dtype cast)."""


def keep_float32(model: ModuleT) -> ModuleT:
    """Cast `Float32Module`s, and the parameters a module names in its `float32_params`
    class attribute (single tensors such as attention sinks), back to float32."""
    for module in model.modules():
        if isinstance(module, Float32Module):
            module.float()
        for name in getattr(module, "float32_params", ()):
            param = getattr(module, name)
            param.data = param.data.float()
    return model


class Float32Buffers(nn.Module):
    """A module whose float32 buffers stay float32 and unrounded through `model.to(dtype)`:
    a bfloat16 cast would round rotary frequencies to 8 bits (a phase error that grows with
    the position), where transformers keeps them float32. Device moves still apply."""

    def _apply(self, fn, recurse=True):  # type: ignore[no-untyped-def]
        exact = {
            name: buf
            for name, buf in self._buffers.items()
            if buf is not None and buf.dtype == torch.float32
        }
        super()._apply(fn, recurse)
        for name, before in exact.items():
            after = self._buffers[name]
            assert after is not None
            self._buffers[name] = before.to(after.device)
        return self


class Rotary(Float32Buffers):
    """Rotate-half rotary embedding; cos/sin are computed in float32 from absolute positions
    and float32 frequencies (whatever the model's dtype)."""

    def __init__(self, rope: RopeConfig, head_dim: int) -> None:
        super().__init__()
        self.inv_freq: torch.Tensor
        self.register_buffer("inv_freq", rope.inv_freq(head_dim), persistent=False)
        self.attention_factor = rope.attention_factor

    def cos_sin(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        freqs = positions[:, None].float() * self.inv_freq[None, :].float()
        emb = torch.cat((freqs, freqs), dim=-1)
        if self.attention_factor != 1.0:  # YaRN scales cos and sin
            return emb.cos() * self.attention_factor, emb.sin() * self.attention_factor
        return emb.cos(), emb.sin()


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [T, H, D]; cos/sin [T, R] (float32), R <= D: the leading R dims of every head turn
    (partial rotary, GLM-4.5), the other D - R pass unchanged."""
    if cos.shape[-1] < x.shape[-1]:
        turned = apply_rotary(x[..., : cos.shape[-1]], cos, sin)
        return torch.cat((turned, x[..., cos.shape[-1] :]), dim=-1)
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    cos, sin = cos[:, None, :].to(x.dtype), sin[:, None, :].to(x.dtype)
    return x * cos + rotated * sin


class GatedMLP(nn.Module):
    """down(act(gate(x)) * up(x)), Hugging Face parameter names."""

    def __init__(self, hidden: int, inner: int, act: str, bias: bool = False) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(hidden, inner, bias=bias)
        self.up_proj = nn.Linear(hidden, inner, bias=bias)
        self.down_proj = nn.Linear(inner, hidden, bias=bias)
        self.act = activation(act)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.down_proj(self.act(self.gate_proj(x)) * self.up_proj(x))
        return out


class GptOssExperts(nn.Module):
    """gpt-oss experts in Hugging Face's fused layout: `gate_up_proj` [E, H, 2I] with gate and
    up interleaved on the last dim, `down_proj` [E, I, H], both with biases; the activation is
    `(clamp(up, -l, l) + 1) * g * sigmoid(alpha * g)` with `g = clamp(gate, max=l)`."""

    def __init__(self, hidden: int, inner: int, num_experts: int, limit: float, alpha: float):
        super().__init__()
        self.limit, self.alpha = limit, alpha
        self.gate_up_proj = nn.Parameter(torch.empty(num_experts, hidden, 2 * inner))
        self.gate_up_proj_bias = nn.Parameter(torch.empty(num_experts, 2 * inner))
        self.down_proj = nn.Parameter(torch.empty(num_experts, inner, hidden))
        self.down_proj_bias = nn.Parameter(torch.empty(num_experts, hidden))

    def expert(self, e: int, x: torch.Tensor) -> torch.Tensor:
        gate_up = x @ self.gate_up_proj[e] + self.gate_up_proj_bias[e]
        gate = gate_up[..., ::2].clamp(max=self.limit)
        up = gate_up[..., 1::2].clamp(-self.limit, self.limit)
        act = (up + 1) * gate * torch.sigmoid(gate * self.alpha)
        out: torch.Tensor = act @ self.down_proj[e] + self.down_proj_bias[e]
        return out


class GptOssMoe(nn.Module):
    """gpt-oss MLP: `router` (a biased linear) picks the top-k logits, softmax over those k."""

    def __init__(self, hidden: int, inner: int, num_experts: int, top_k: int, limit: float,
                 alpha: float) -> None:  # fmt: skip
        super().__init__()
        self.top_k = top_k
        self.router = nn.Linear(hidden, num_experts, bias=True)
        self.experts = GptOssExperts(hidden, inner, num_experts, limit, alpha)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        top, chosen = torch.topk(self.router(x), self.top_k, dim=-1)
        weights = torch.softmax(top, dim=-1)
        out = torch.zeros_like(x)
        for expert_id in torch.unique(chosen).tolist():
            token_idx, slot = torch.where(chosen == expert_id)
            y = self.experts.expert(expert_id, x[token_idx]) * weights[token_idx, slot, None]
            out.index_add_(0, token_idx, y.to(x.dtype))
        return out


class SparseMoe(nn.Module):
    """Top-k routed experts: softmax over all experts in float32, keep the top k (optionally
    renormalised), sum the chosen experts' outputs weighted by their routing probabilities."""

    def __init__(
        self, hidden: int, inner: int, num_experts: int, top_k: int, norm_topk: bool, act: str
    ) -> None:
        super().__init__()
        self.top_k = top_k
        self.norm_topk = norm_topk
        self.gate = nn.Linear(hidden, num_experts, bias=False)
        self.experts = nn.ModuleList(GatedMLP(hidden, inner, act) for _ in range(num_experts))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        probs = torch.softmax(self.gate(x), dim=-1, dtype=torch.float32)
        weights, chosen = torch.topk(probs, self.top_k, dim=-1)
        if self.norm_topk:
            weights = weights / weights.sum(dim=-1, keepdim=True)
        weights = weights.to(x.dtype)
        out = torch.zeros_like(x)
        # One pass per expert that received tokens; the routing decides the work, not the batch.
        for expert_id in torch.unique(chosen).tolist():
            token_idx, slot = torch.where(chosen == expert_id)
            y = self.experts[expert_id](x[token_idx]) * weights[token_idx, slot, None]
            out.index_add_(0, token_idx, y)
        return out


def paged_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cache: torch.Tensor,
    batch: AttentionBatch,
    scale: float,
    softcap: float | None = None,
    sinks: torch.Tensor | None = None,
) -> torch.Tensor:
    """Causal (or windowed) attention of this step's queries over cached + new keys.

    q [T, Hq, D], k/v [T, Hkv, D] (after rope); `cache` is this layer's [pages, 2, page_size,
    Hkv, D] view. Cached keys are gathered through the plan's page rows *before* the new K/V are
    written to their append slots, so a slot reused within the step cannot corrupt a read.
    `sinks` [Hq] (gpt-oss): a per-head logit that joins the softmax as one extra column and
    is dropped after it. Returns [T, Hq * D].
    """
    k_cached = cache[batch.cached_pages, 0, batch.cached_offsets]  # [B, C, Hkv, D]
    v_cached = cache[batch.cached_pages, 1, batch.cached_offsets]
    cache[batch.append_pages, 0, batch.append_offsets] = k.to(cache.dtype)
    cache[batch.append_pages, 1, batch.append_offsets] = v.to(cache.dtype)
    # Scores, softmax and the weighted sum in float32 over the (rounded) cached K/V, as fused
    # attention kernels do (transformers' SDPA path); only the output is rounded.
    keys = torch.cat((k_cached, k[batch.query_index]), dim=1).float()  # [B, C+Q, Hkv, D]
    values = torch.cat((v_cached, v[batch.query_index]), dim=1).float()
    # Query head h reads key head h // groups: the query heads are viewed as [Hkv, groups] so
    # each key is read once per key head, not copied `groups` times.
    shape = (*batch.query_index.shape, k.shape[1], q.shape[1] // k.shape[1], q.shape[2])
    queries = q[batch.query_index].float().view(shape)  # [B, Q, Hkv, groups, D]
    scores = torch.einsum("bqhgd,bkhd->bhgqk", queries, keys).flatten(1, 2) * scale
    if softcap is not None:
        scores = torch.tanh(scores / softcap) * softcap
    scores = scores.masked_fill(~batch.mask[:, None], float("-inf"))
    if sinks is not None:
        column = sinks.to(scores.dtype)[None, :, None, None].expand(*scores.shape[:3], 1)
        scores = torch.cat((scores, column), dim=-1)
    probs = torch.softmax(scores, dim=-1)
    if sinks is not None:
        probs = probs[..., :-1]
    probs = torch.nan_to_num(probs)  # padded query slots see no key at all
    out = torch.einsum("bhgqk,bkhd->bqhgd", probs.unflatten(1, shape[2:4]), values)
    return out[batch.token_rows, batch.token_cols].reshape(q.shape[0], -1).to(q.dtype)


def short_conv(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    cache: torch.Tensor,
    batch: StateBatch,
) -> torch.Tensor:
    """Depthwise causal conv over each row's tokens, continuing from its stored state.

    x [T, C] (the conv input); weight [C, 1, K]; `cache` is this layer's [pages, C, K-1] view.
    A row's state is its last K-1 conv inputs: read from `state_in` (zeros when -1), written to
    `state_out` and to the requested checkpoint pages after everything was read.
    """
    padded = (x[batch.query_index] * batch.query_valid[..., None]).transpose(1, 2)  # [B, C, Q]
    start = cache[batch.state_in.clamp(min=0)].to(x.dtype)
    start = start * batch.has_state.to(x.dtype)[:, None, None]
    full = torch.cat((start, padded), dim=-1)  # [B, C, K-1+Q]
    out = F.conv1d(full, weight.to(x.dtype), bias, groups=x.shape[1])  # [B, C, Q]
    channels = x.shape[1]
    final = full.gather(-1, batch.final_window[:, None, :].expand(-1, channels, -1))
    if batch.checkpoint_pages.numel():
        windows = batch.checkpoint_window[:, None, :].expand(-1, channels, -1)
        checkpoints = full[batch.checkpoint_rows].gather(-1, windows)
        cache[batch.checkpoint_pages] = checkpoints.to(cache.dtype)
    cache[batch.state_out] = final[batch.state_rows].to(cache.dtype)
    return out.transpose(1, 2)[batch.token_rows, batch.token_cols]
