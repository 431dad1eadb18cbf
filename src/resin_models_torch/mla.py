"""DeepSeek's multi-head latent attention (MLA) over the paged latent cache.

Per token and layer the cache keeps one vector: the normed KV latent (`kv_lora_rank`) and the
rotated shared rotary key (`rope_dim`) — never per-head K/V. Each step gathers the cached
latents of its rows (before writing its own), expands latents to per-head keys and values with
`kv_b_proj`, and attends causally, as `transformers` does after its latent cache update.

Interleaved rotary (V2's complex form, V3's `rope_interleave`) rotates pairs (x0, x1), ...;
it is computed on the de-interleaved vector [x0, x2, ... | x1, x3, ...] with the rotate-half
formula. Queries and keys get the same permutation, so every score is unchanged.
"""

from __future__ import annotations

import torch
from torch import nn

from resin_model.config import ModelConfig
from resin_model.nn import RMSNorm
from resin_models_torch.batch import AttentionBatch, LayerSlot, StepContext
from resin_models_torch.layers import apply_rotary

# DeepSeek's q_a / kv_a norms use the RMSNorm default, not rms_norm_eps.
LATENT_NORM_EPS = 1e-6


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, interleave: bool) -> torch.Tensor:
    """x [T, H, R]; cos/sin [T, R]."""
    if interleave:
        x = torch.cat((x[..., 0::2], x[..., 1::2]), dim=-1)
    return apply_rotary(x, cos, sin)


class MlaAttention(nn.Module):
    """Parameter names are DeepSeek's (`q_a_proj`, `kv_a_proj_with_mqa`, `kv_b_proj`, ...)."""

    def __init__(self, config: ModelConfig, slot: LayerSlot) -> None:
        super().__init__()
        mla = config.mla
        assert mla is not None
        self.mla, self.slot, self.scale = mla, slot, config.scale
        hidden, heads = config.hidden_size, config.num_heads
        qk_dim = mla.nope_dim + mla.rope_dim
        self.q_proj: nn.Linear | None = None
        self.q_a_proj: nn.Linear | None = None
        self.q_a_layernorm: RMSNorm | None = None
        self.q_b_proj: nn.Linear | None = None
        if mla.q_lora_rank is None:
            self.q_proj = nn.Linear(hidden, heads * qk_dim, bias=False)
        else:
            self.q_a_proj = nn.Linear(hidden, mla.q_lora_rank, bias=False)
            self.q_a_layernorm = RMSNorm(mla.q_lora_rank, LATENT_NORM_EPS)
            self.q_b_proj = nn.Linear(mla.q_lora_rank, heads * qk_dim, bias=False)
        self.kv_a_proj_with_mqa = nn.Linear(hidden, mla.latent_dim, bias=False)
        self.kv_a_layernorm = RMSNorm(mla.kv_lora_rank, LATENT_NORM_EPS)
        self.kv_b_proj = nn.Linear(
            mla.kv_lora_rank, heads * (mla.nope_dim + mla.v_head_dim), bias=False
        )
        self.o_proj = nn.Linear(heads * mla.v_head_dim, hidden, bias=False)

    def queries(self, x: torch.Tensor) -> torch.Tensor:
        if self.q_proj is not None:
            q: torch.Tensor = self.q_proj(x)
            return q
        assert self.q_a_proj is not None and self.q_a_layernorm is not None
        assert self.q_b_proj is not None
        out: torch.Tensor = self.q_b_proj(self.q_a_layernorm(self.q_a_proj(x)))
        return out

    def forward(
        self, x: torch.Tensor, ctx: StepContext, cos: torch.Tensor, sin: torch.Tensor
    ) -> torch.Tensor:
        mla, t = self.mla, x.shape[0]
        q_nope, q_rot = (
            self.queries(x)
            .view(t, -1, mla.nope_dim + mla.rope_dim)
            .split([mla.nope_dim, mla.rope_dim], dim=-1)
        )
        latent, k_rot = self.kv_a_proj_with_mqa(x).split([mla.kv_lora_rank, mla.rope_dim], dim=-1)
        q_rot = rotate(q_rot, cos, sin, mla.rope_interleave)
        k_rot = rotate(k_rot[:, None], cos, sin, mla.rope_interleave)[:, 0]
        entry = torch.cat((self.kv_a_layernorm(latent), k_rot), dim=-1)  # [T, latent_dim]
        cache, batch = ctx.attention(self.slot)
        entries = paged_latents(entry, cache, batch)  # [B, C+Q, latent_dim]
        queries = torch.cat((q_nope, q_rot), dim=-1)[batch.query_index]  # [B, Q, H, qk]
        out = self.attend(queries, entries, batch)
        result: torch.Tensor = self.o_proj(out)
        return result

    def attend(
        self, queries: torch.Tensor, entries: torch.Tensor, batch: AttentionBatch
    ) -> torch.Tensor:
        """Expand latents to per-head K/V and attend; returns [T, H * v_head_dim]."""
        mla = self.mla
        b, k = entries.shape[:2]
        latent, k_rot = entries.split([mla.kv_lora_rank, mla.rope_dim], dim=-1)
        kv = self.kv_b_proj(latent).view(b, k, -1, mla.nope_dim + mla.v_head_dim)
        k_nope, values = kv.split([mla.nope_dim, mla.v_head_dim], dim=-1)
        shared = k_rot[:, :, None, :].expand(-1, -1, k_nope.shape[2], -1)  # one rotary key
        keys = torch.cat((k_nope, shared), dim=-1)
        # Scores, softmax and the weighted sum in float32 (as fused attention kernels keep
        # them); only the output is rounded to the model's dtype.
        scores = torch.einsum("bqhd,bkhd->bhqk", queries.float(), keys.float()) * self.scale
        scores = scores.masked_fill(~batch.mask[:, None], float("-inf"))
        probs = torch.nan_to_num(torch.softmax(scores, dim=-1))  # padded slots see no key
        out = torch.einsum("bhqk,bkhd->bqhd", probs, values.float())
        t = batch.token_rows.shape[0]
        return out[batch.token_rows, batch.token_cols].reshape(t, -1).to(queries.dtype)


def paged_latents(entry: torch.Tensor, cache: torch.Tensor, batch: AttentionBatch) -> torch.Tensor:
    """Cached latents of each row, then this step's (grid order): [B, C+Q, latent_dim].

    `cache` is this layer's [pages, page_size, latent_dim] view; cached entries are gathered
    before the new ones are written to their append slots (a slot reused within the step
    cannot corrupt a read)."""
    cached = cache[batch.cached_pages, batch.cached_offsets]
    if batch.append_pages.numel():  # a draft query (MTP) is attended but not stored
        cache[batch.append_pages, batch.append_offsets] = entry.to(cache.dtype)
    return torch.cat((cached.to(entry.dtype), entry[batch.query_index]), dim=1)
