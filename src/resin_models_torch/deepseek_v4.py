"""DeepSeek-V4 (Flash): shared K=V multi-query attention over a raw window plus compressed
entries, a routed MoE (hash-routed first layers) and an mHC residual of `hc_mult` streams.

Attention (every layer): queries through a low-rank path (`q_a_proj`, `q_a_norm`, `q_b_proj`,
then an unweighted per-head RMS norm); one 512-wide vector per token (`kv_proj`, `kv_norm`)
serves as key and value. Rotary turns interleaved pairs of the trailing `rope_dim` channels
(float32), with the plain `main` table in sliding-only layers and the YaRN `compress` table in
the others. Logits join a per-head sink in a float32 softmax; the output's rope channels are
turned back by the query's position (V carries rotary), then the grouped low-rank projection
(`o_a_proj` per group of heads, `o_b_proj`).

Compressed entries (`attention[i]` "csa" / "hca", ratio m): entry w pools the tokens of its
window with a per-channel softmax of `gate_proj(x) + position_bias[slot]` over `kv_proj(x)`,
then `kv_norm` and rotary at position m * w. HCA windows are the m tokens [mw, mw + m); CSA
entries span 2m tokens, the previous window's first half-channels (Ca) and the window's own
second half (Cb). Query p sees entry w once its last token is <= p (w < (p + 1) // m); HCA
reads all of them, CSA those the indexer picks: its own compressor keys (width
`index_head_dim`), scored sum_h w_h(x) ReLU(q_h . k) in float32, top `index_topk`.

Cache groups: every layer's K=V vectors form a Window group (`LatentSpec` with a window);
per compressed kind present, a Compressed(m) group holds its layers' entries (CSA: the K=V
entry, then the indexer's key) and a State group the projections (`kv_proj` / `gate_proj`
outputs, and the indexer's) that entries to come still need: the incomplete block, and for
CSA the last complete one, whose first half joins the next entry (transformers' "overlap").
A step reads each row's state, pools the entries its tokens complete into the slots the plan
names, and stores the new state (and the checkpoints the plan asks for, from which a prefix
hit at any page boundary resumes). Entries equal transformers' whatever the chunking: each is
pooled once, from the same projections, in float32 softmax.

Checkpoint names: the published layout (`layers.N.attn.wq_a`, `ffn.experts.E.w1`,
`hc_attn_fn`, `embed`, `head`; with or without `model.`, as transformers saves it) maps to
transformers' module names (`checkpoint_name`). The MTP layer (`mtp.0.*`, which transformers
does not build) loads into `mtp` when the checkpoint has it; `MtpRunner` drafts with it.

Speculative decoding: rejected drafts leave entries and window vectors past the kept length,
rewritten before any query reads them, as for any paged group. The pending projections are a
State, so a runner that drafts declares them with `rewind` = its draft count: each state page
is a ring over positions (slot p % capacity, capacity = what a length needs + rewind) and a
step writes every position the lengths `total - rewind .. total` need, so the next step reads
the state as of whatever length the engine kept.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch
import torch.nn.functional as F
from torch import nn

from resin_model.config import AttentionKind, DeepseekV4Config, ModelConfig, RopeConfig
from resin_model.hf_deepseek_v4 import checkpoint_name as v4_checkpoint_name
from resin_model.nn import RMSNorm
from resin_models_torch.base import Backbone, CausalLM
from resin_models_torch.batch import (
    AttentionBatch,
    BufferSpec,
    CacheSpec,
    EntrySpec,
    LatentSpec,
    LayerSlot,
    StepContext,
)
from resin_models_torch.layers import Float32Module
from resin_models_torch.mhc import HyperConnection, HyperHead, hc_mix, unweighted_rms_norm
from resin_models_torch.mla import paged_latents


class V4Norm(RMSNorm, Float32Module):
    """RMS norm with a float32 weight applied before the cast back (Llama casts first)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xf = x.float()
        normed = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return (self.weight.float() * normed).to(x.dtype)


class V4Rotary(nn.Module):
    """Interleaved-pair rotary on the trailing channels: cos / sin [T, rope_dim / 2]."""

    def __init__(self, rope: RopeConfig, rope_dim: int) -> None:
        super().__init__()
        self.inv_freq: torch.Tensor
        self.register_buffer("inv_freq", rope.inv_freq(rope_dim), persistent=False)
        self.attention_factor = rope.attention_factor

    def cos_sin(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        freqs = positions[:, None].float() * self.inv_freq[None, :].float()
        return freqs.cos() * self.attention_factor, freqs.sin() * self.attention_factor


def rope_tail(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Turn pairs (x0, x1), (x2, x3), ... of x's trailing 2 * cos.shape[-1] channels.

    x [T, ..., D]; cos / sin [T, R / 2] float32, rounded to x's dtype first as transformers
    does, then applied in float32."""
    r = 2 * cos.shape[-1]
    shape = (cos.shape[0],) + (1,) * (x.dim() - 2) + (r,)
    cos = cos.to(x.dtype).repeat_interleave(2, dim=-1).float().view(shape)
    sin = sin.to(x.dtype).repeat_interleave(2, dim=-1).float().view(shape)
    nope, rope = x[..., :-r], x[..., -r:].float()
    turned = torch.stack((-rope[..., 1::2], rope[..., 0::2]), dim=-1).flatten(-2)
    return torch.cat((nope, (rope * cos + turned * sin).to(x.dtype)), dim=-1)


class Compressor(nn.Module):
    """Pools every `ratio` tokens into one entry of `width` values. With `overlap` (CSA) each
    token projects to 2 * width: Ca (first half, for the next entry) and Cb (its own)."""

    float32_params = ("position_bias",)

    def __init__(self, hidden: int, width: int, ratio: int, overlap: bool, eps: float) -> None:
        super().__init__()
        self.width, self.ratio, self.overlap = width, ratio, overlap
        proj = 2 * width if overlap else width
        self.kv_proj = nn.Linear(hidden, proj, bias=False)
        self.gate_proj = nn.Linear(hidden, proj, bias=False)
        self.position_bias = nn.Parameter(torch.empty(ratio, proj))
        self.kv_norm = V4Norm(width, eps)

    @property
    def cached_width(self) -> int:
        """Values kept per token in the History group: the kv and gate projections."""
        return 2 * self.kv_proj.out_features

    def project(self, x: torch.Tensor) -> torch.Tensor:
        """x [T, hidden] -> [T, cached_width]: what the cache keeps of each token."""
        return torch.cat((self.kv_proj(x), self.gate_proj(x)), dim=-1)

    def buffer_start(self, length: int) -> int:
        """First position whose projection a sequence of `length` tokens still needs for
        entries to come: the incomplete block, and for CSA the last complete one (its Ca
        half joins the next entry)."""
        complete = length // self.ratio
        return max(0, complete - 1 if self.overlap else complete) * self.ratio

    @property
    def buffer_tokens(self) -> int:
        """The most projections `buffer_start` ever keeps."""
        return max(1, (2 * self.ratio if self.overlap else self.ratio) - 1)

    def entries(
        self, projected: torch.Tensor, start: int, first: int, end: int, rotary: V4Rotary
    ) -> torch.Tensor:
        """Entries w in [first, end) from `project` outputs of positions start, start+1, ...
        (which hold every token those entries pool) -> [end - first, width]."""
        m, w = self.ratio, self.width
        windows = torch.arange(first, end, device=projected.device)
        slots = torch.arange(m, device=projected.device)
        index = windows[:, None] * m - start + slots[None, :]  # [E, m]
        kv_all, gate_all = projected.chunk(2, dim=-1)
        kv, gate = kv_all[index], gate_all[index] + self.position_bias  # float32 gate
        if self.overlap:  # slots: Ca of the previous block (none for entry 0), then Cb
            prev = (index - m).clamp(min=0)
            none = (windows == 0)[:, None, None]
            prev_kv = kv_all[prev][..., :w].masked_fill(none, 0.0)
            prev_gate = (gate_all[prev] + self.position_bias)[..., :w]
            prev_gate = prev_gate.masked_fill(none, float("-inf"))
            kv = torch.cat((prev_kv, kv[..., w:]), dim=1)
            gate = torch.cat((prev_gate, gate[..., w:]), dim=1)
        weights = gate.softmax(dim=1, dtype=torch.float32).to(kv.dtype)
        pooled = self.kv_norm((kv * weights).sum(dim=1))
        return rope_tail(pooled, *rotary.cos_sin(windows * m))


def _ring(lo: int, hi: int, capacity: int, device: torch.device) -> torch.Tensor:
    """Ring slots of positions lo .. hi - 1 in a state page of `capacity` tokens."""
    return torch.arange(lo, hi, device=device) % capacity


class IndexerScorer(nn.Module):
    def __init__(self, hidden: int, heads: int) -> None:
        super().__init__()
        self.weights_proj = nn.Linear(hidden, heads, bias=False)


class Indexer(Compressor):
    """Lightning indexer of a CSA layer: a compressor of its own for the keys (width
    `index_head_dim`), query heads from the shared query residual, per-head weights."""

    def __init__(self, config: ModelConfig, v4: DeepseekV4Config) -> None:
        hidden, dim = config.hidden_size, v4.index_head_dim
        super().__init__(hidden, dim, v4.csa_ratio, True, config.norm_eps)
        self.heads, self.topk = v4.index_heads, v4.index_topk
        self.q_b_proj = nn.Linear(v4.q_lora_rank, self.heads * dim, bias=False)
        self.scorer = IndexerScorer(hidden, self.heads)

    def select(
        self,
        x: torch.Tensor,
        q_residual: torch.Tensor,
        keys: torch.Tensor,
        positions: torch.Tensor,
        cos_sin: tuple[torch.Tensor, torch.Tensor],
    ) -> torch.Tensor:
        """A row's queries (x, q_residual [Q, .], positions [Q]) against its indexer keys
        [E, dim] -> [Q, E] bool: the entries each query attends."""
        q = self.q_b_proj(q_residual).view(-1, self.heads, self.width)
        q = rope_tail(q, *cos_sin)
        scores = torch.einsum("qhd,ed->qhe", q.float(), keys.float()).relu() * self.width**-0.5
        weights = self.scorer.weights_proj(x).float() * self.heads**-0.5
        total = (scores * weights[..., None]).sum(dim=1)  # [Q, E]
        entry = torch.arange(keys.shape[0], device=x.device)[None, :]
        visible = entry < (positions[:, None] + 1) // self.ratio
        total = total.masked_fill(~visible, float("-inf"))
        chosen = total.topk(min(self.topk, keys.shape[0]), dim=-1).indices
        selected = torch.zeros_like(visible).scatter_(1, chosen, True)
        return selected & visible


class V4Compressed(Compressor):
    """`self_attn.compressor`: the entries of a CSA (overlapping, with an `indexer`) or HCA
    layer."""

    def __init__(self, config: ModelConfig, v4: DeepseekV4Config, csa: bool) -> None:
        ratio = v4.csa_ratio if csa else v4.hca_ratio
        super().__init__(config.hidden_size, config.head_dim, ratio, csa, config.norm_eps)
        self.indexer = Indexer(config, v4) if csa else None

    def project_all(self, x: torch.Tensor) -> torch.Tensor:
        """What the History group keeps per token: this compressor's and the indexer's
        projections."""
        if self.indexer is None:
            return self.project(x)
        return torch.cat((self.project(x), self.indexer.project(x)), dim=-1)

    @property
    def all_width(self) -> int:
        """Projected values buffered per token (this compressor's and the indexer's)."""
        extra = self.indexer.cached_width if self.indexer is not None else 0
        return self.cached_width + extra

    @property
    def entry_width(self) -> int:
        """Values per cached entry: the K=V entry, then the indexer's key."""
        return self.width + (self.indexer.width if self.indexer is not None else 0)

    def new_entries(
        self, tokens: torch.Tensor, start: int, first: int, end: int, rotary: V4Rotary
    ) -> torch.Tensor:
        """Entries [first, end) with the indexer's keys beside them: [n, entry_width]."""
        split = self.cached_width
        pooled = self.entries(tokens[:, :split], start, first, end, rotary)
        if self.indexer is None:
            return pooled
        keys = self.indexer.entries(tokens[:, split:], start, first, end, rotary)
        return torch.cat((pooled, keys), dim=-1)


@dataclass(frozen=True, slots=True)
class Row:
    """One plan row's flat query tokens and their positions (contiguous, cached before)."""

    tokens: torch.Tensor
    positions: torch.Tensor
    cached: int
    total: int


@dataclass(frozen=True, slots=True)
class V4Slots:
    """Where a layer keeps its cache: the K=V window, and for CSA / HCA layers the entries
    (Compressed group) and the projections not yet pooled (State group)."""

    window: LayerSlot
    entries: LayerSlot | None = None
    buffer: LayerSlot | None = None


class V4Attention(nn.Module):
    float32_params = ("sinks",)

    def __init__(self, config: ModelConfig, kind: AttentionKind, slots: V4Slots) -> None:
        super().__init__()
        v4 = config.deepseek_v4
        assert v4 is not None
        self.v4, self.slots = v4, slots
        hidden, heads, d = config.hidden_size, config.num_heads, config.head_dim
        self.heads, self.dim, self.eps = heads, d, config.norm_eps
        self.q_a_proj = nn.Linear(hidden, v4.q_lora_rank, bias=False)
        self.q_a_norm = V4Norm(v4.q_lora_rank, config.norm_eps)
        self.q_b_proj = nn.Linear(v4.q_lora_rank, heads * d, bias=False)
        self.kv_proj = nn.Linear(hidden, d, bias=False)
        self.kv_norm = V4Norm(d, config.norm_eps)
        self.o_a_proj = nn.Linear(heads * d // v4.o_groups, v4.o_groups * v4.o_lora_rank, False)
        self.o_b_proj = nn.Linear(v4.o_groups * v4.o_lora_rank, hidden, bias=False)
        self.sinks = nn.Parameter(torch.empty(heads))
        self.compressor = None if kind == "sliding" else V4Compressed(config, v4, kind == "csa")

    def forward(
        self, x: torch.Tensor, ctx: StepContext, rows: list[Row], rotary: V4Rotary
    ) -> torch.Tensor:
        cos, sin = rotary.cos_sin(ctx.positions)
        q_residual = self.q_a_norm(self.q_a_proj(x))
        q = self.q_b_proj(q_residual).view(x.shape[0], self.heads, self.dim)
        q = rope_tail(unweighted_rms_norm(q, self.eps), cos, sin)
        kv = rope_tail(self.kv_norm(self.kv_proj(x)), cos, sin)
        cache, batch = ctx.attention(self.slots.window)
        window_kv = paged_latents(kv, cache, batch)  # [B, C + Q, D]
        entries = self._update_entries(x, ctx, rows, rotary) if self.compressor else None
        out = torch.empty_like(q)
        for b, row in enumerate(rows):
            n = row.tokens.shape[0]
            keys, mask = window_kv[b], batch.mask[b, :n]
            if entries is not None:
                pooled, visible = self._visible(row, entries[b], x, q_residual, rotary)
                keys, mask = torch.cat((keys, pooled)), torch.cat((mask, visible), dim=1)
            out[row.tokens] = self._attend(q[row.tokens], keys, mask)
        out = rope_tail(out, cos, -sin)  # V carried rotary: turn it back by the query's position
        groups = out.view(x.shape[0], self.v4.o_groups, -1)
        weight = self.o_a_proj.weight.view(self.v4.o_groups, self.v4.o_lora_rank, -1)
        grouped = torch.einsum("tgi,gli->tgl", groups, weight).flatten(1)
        result: torch.Tensor = self.o_b_proj(grouped)
        return result

    def _update_entries(
        self, x: torch.Tensor, ctx: StepContext, rows: list[Row], rotary: V4Rotary
    ) -> list[torch.Tensor]:
        """Pool the entries the step completes into the Compressed group, carry the unpooled
        projections in the State group (and its checkpoints); returns each row's entries
        after the step [E_b, entry_width]."""
        comp = self.compressor
        assert comp is not None and self.slots.entries and self.slots.buffer
        projected = comp.project_all(x)
        store, ebatch = ctx.entries(self.slots.entries)
        buffers, sbatch = ctx.state(self.slots.buffer)
        # A state page is a ring: position p's projections live in slot p % capacity.
        # Capacity beyond `buffer_tokens` is the group's rewind: the state written after a
        # step also serves the shorter lengths the engine may keep (rejected drafts).
        capacity = buffers.shape[1]
        rewind = capacity - comp.buffer_tokens
        state_in = sbatch.state_in.tolist()
        out_page = dict(zip(sbatch.state_rows.tolist(), sbatch.state_out.tolist(), strict=True))
        ckpt_rows, ckpt_local = sbatch.checkpoint_rows.tolist(), sbatch.checkpoint_local.tolist()
        ckpt_pages = sbatch.checkpoint_pages.tolist()
        # after every read of this layer's states: (page, ring slots, projections)
        writes: list[tuple[int, torch.Tensor, torch.Tensor]] = []
        result = []
        for b, row in enumerate(rows):
            start = comp.buffer_start(row.cached)
            fresh = projected[row.tokens]
            tokens = fresh
            if row.cached > start:
                if state_in[b] < 0:
                    raise ValueError("a row resumes without its compressor state")
                held = buffers[state_in[b], _ring(start, row.cached, capacity, x.device)]
                tokens = torch.cat((held.to(fresh.dtype), fresh))
            first, end = row.cached // comp.ratio, row.total // comp.ratio
            if end > first:
                lo, hi = ebatch.new_indptr[b], ebatch.new_indptr[b + 1]
                assert hi - lo == end - first, "the plan's entry slots disagree with the row"
                new = comp.new_entries(tokens, start, first, end, rotary)
                store[ebatch.new_pages[lo:hi], ebatch.new_offsets[lo:hi]] = new.to(store.dtype)
            count = ebatch.counts[b]
            result.append(store[ebatch.pages[b, :count], ebatch.offsets[b, :count]].to(x.dtype))
            # (page, length, shortest length the page must also serve)
            ends = []
            if b in out_page:
                ends.append((out_page[b], row.total, max(row.total - rewind, row.cached)))
            ends += [(page, row.cached + local + 1, row.cached + local + 1) for r, local, page
                     in zip(ckpt_rows, ckpt_local, ckpt_pages, strict=True) if r == b]  # fmt: skip
            for page, length, shortest in ends:
                lo = comp.buffer_start(shortest)
                keep = tokens[lo - start : length - start]
                writes.append((page, _ring(lo, length, capacity, x.device), keep))
        for page, slots, keep in writes:
            buffers[page, slots] = keep.to(buffers.dtype)
        return result

    def _visible(
        self,
        row: Row,
        entries: torch.Tensor,
        x: torch.Tensor,
        q_residual: torch.Tensor,
        rotary: V4Rotary,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """A row's K=V entries [E, D] and which ones each of its queries reads [Q, E]."""
        comp = self.compressor
        assert comp is not None
        pooled = entries[:, : self.dim]
        if comp.indexer is None:
            index = torch.arange(entries.shape[0], device=x.device)
            return pooled, index[None, :] < (row.positions[:, None] + 1) // comp.ratio
        keys = entries[:, self.dim :]
        cos_sin = rotary.cos_sin(row.positions)
        sel = comp.indexer.select(x[row.tokens], q_residual[row.tokens], keys, row.positions,
                                  cos_sin)  # fmt: skip
        return pooled, sel

    def _attend(self, q: torch.Tensor, keys: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """q [Q, H, D] over keys = values [K, D] with mask [Q, K] and the per-head sinks."""
        logits = torch.einsum("qhd,kd->hqk", q, keys.to(q.dtype)) * self.dim**-0.5
        logits = logits.masked_fill(~mask[None], float("-inf"))
        sinks = self.sinks.float()[:, None, None].expand(-1, q.shape[0], 1)
        combined = torch.cat((logits.float(), sinks), dim=-1)
        combined = combined - combined.max(dim=-1, keepdim=True).values
        probs = combined.softmax(dim=-1)[..., :-1].to(q.dtype)
        return torch.einsum("hqk,kd->qhd", probs, keys.to(q.dtype))


class V4Router(nn.Module):
    """`mlp.gate`: sqrt(softplus) scores; experts from the biased scores (top-k) or from the
    token-id table `tid2eid` (hash layers), weighted by their renormalised unbiased scores."""

    float32_params: tuple[str, ...] = ("e_score_correction_bias",)

    def __init__(self, config: ModelConfig, hashed: bool) -> None:
        super().__init__()
        moe = config.moe
        assert moe is not None
        self.top_k, self.scale = moe.top_k, moe.routed_scale
        self.weight = nn.Parameter(torch.empty(moe.num_experts, config.hidden_size))
        self.tid2eid: nn.Parameter | None = None
        self.e_score_correction_bias: nn.Parameter | None = None
        if hashed:
            table = torch.zeros(config.vocab_size, moe.top_k, dtype=torch.long)
            self.tid2eid = nn.Parameter(table, requires_grad=False)
        else:
            self.e_score_correction_bias = nn.Parameter(torch.zeros(moe.num_experts))
        self.float32_params = () if hashed else ("e_score_correction_bias",)

    def forward(self, x: torch.Tensor, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        scores = F.softplus(F.linear(x, self.weight)).sqrt()
        if self.tid2eid is not None:
            chosen = self.tid2eid[ids].long()
        else:
            assert self.e_score_correction_bias is not None
            biased = scores + self.e_score_correction_bias
            chosen = torch.topk(biased, self.top_k, dim=-1, sorted=False).indices
        weights = scores.gather(1, chosen)
        return weights / (weights.sum(dim=-1, keepdim=True) + 1e-20) * self.scale, chosen


class ClampedMLP(nn.Module):
    """SwiGLU with the gate clamped above and the up projection on both sides."""

    def __init__(self, hidden: int, inner: int, limit: float) -> None:
        super().__init__()
        self.limit = limit
        self.gate_proj = nn.Linear(hidden, inner, bias=False)
        self.up_proj = nn.Linear(hidden, inner, bias=False)
        self.down_proj = nn.Linear(inner, hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate = self.gate_proj(x).clamp(max=self.limit)
        up = self.up_proj(x).clamp(-self.limit, self.limit)
        out: torch.Tensor = self.down_proj(F.silu(gate) * up)
        return out


class V4Moe(nn.Module):
    def __init__(self, config: ModelConfig, hashed: bool) -> None:
        super().__init__()
        moe, v4 = config.moe, config.deepseek_v4
        assert moe is not None and v4 is not None
        hidden, limit = config.hidden_size, v4.swiglu_limit
        self.gate = V4Router(config, hashed)
        self.experts = nn.ModuleList(
            ClampedMLP(hidden, moe.intermediate_size, limit) for _ in range(moe.num_experts)
        )
        self.shared_experts = ClampedMLP(hidden, moe.shared_intermediate_size, limit)

    def forward(self, x: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        weights, chosen = self.gate(x, ids)
        out = torch.zeros_like(x)
        for expert_id in torch.unique(chosen).tolist():
            token_idx, slot = torch.where(chosen == expert_id)
            y = self.experts[expert_id](x[token_idx]) * weights[token_idx, slot, None]
            out.index_add_(0, token_idx, y.to(x.dtype))
        return out + self.shared_experts(x)


class V4Layer(nn.Module):
    def __init__(
        self, config: ModelConfig, kind: AttentionKind, hashed: bool, slots: V4Slots
    ) -> None:
        super().__init__()
        v4 = config.deepseek_v4
        assert v4 is not None
        hidden, eps = config.hidden_size, config.norm_eps
        self.uses_compress_rope = kind != "sliding"
        self.self_attn = V4Attention(config, kind, slots)
        self.mlp = V4Moe(config, hashed)
        self.input_layernorm = V4Norm(hidden, eps)
        self.post_attention_layernorm = V4Norm(hidden, eps)
        self.attn_hc = HyperConnection(hidden, v4.hc_mult, v4.hc_iterations, v4.hc_eps, eps)
        self.ffn_hc = HyperConnection(hidden, v4.hc_mult, v4.hc_iterations, v4.hc_eps, eps)

    def forward(
        self,
        streams: torch.Tensor,
        ids: torch.Tensor,
        ctx: StepContext,
        rows: list[Row],
        rotary: V4Rotary,
    ) -> torch.Tensor:
        post, comb, collapsed = self.attn_hc(streams)
        out = self.self_attn(self.input_layernorm(collapsed), ctx, rows, rotary)
        streams = hc_mix(streams, post, comb, out)
        post, comb, collapsed = self.ffn_hc(streams)
        out = self.mlp(self.post_attention_layernorm(collapsed), ids)
        return hc_mix(streams, post, comb, out)


class V4MtpLayer(V4Layer):
    """`mtp.k`: the multi-token-prediction block of the published checkpoint (transformers
    does not build it). Token i's embedding and the main model's final streams at i-1 (before
    `hc_head`) become its input streams, `e_proj(enorm(embed)) + h_proj(hnorm(stream))` per
    stream; a sliding-only decoder layer (its K=V window is one more layer of the Window
    group, non-hashed routing) follows, then its own `hc_head` and `norm` and the shared LM
    head: the logits of token i + 1. The layer's output streams are what a chained draft pairs
    with next."""

    def __init__(self, config: ModelConfig, slots: V4Slots) -> None:
        super().__init__(config, "sliding", False, slots)
        v4 = config.deepseek_v4
        assert v4 is not None
        hidden, eps = config.hidden_size, config.norm_eps
        self.e_proj = nn.Linear(hidden, hidden, bias=False)
        self.h_proj = nn.Linear(hidden, hidden, bias=False)
        self.enorm = V4Norm(hidden, eps)
        self.hnorm = V4Norm(hidden, eps)
        self.norm = V4Norm(hidden, eps)
        self.hc_head = HyperHead(hidden, v4.hc_mult, v4.hc_eps, eps)

    def draft(
        self,
        embeds: torch.Tensor,
        previous: torch.Tensor,
        ids: torch.Tensor,
        ctx: StepContext,
        rotary: V4Rotary,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """embeds [T, hidden], previous streams [T, n, hidden] -> (hidden for the LM head
        [T, hidden], output streams [T, n, hidden])."""
        streams = self.e_proj(self.enorm(embeds))[:, None, :] + self.h_proj(self.hnorm(previous))
        streams = self(streams, ids, ctx, step_rows(ctx), rotary)
        return self.norm(self.hc_head(streams)), streams


class V4Backbone(Backbone):
    def __init__(self, config: ModelConfig, layers: nn.ModuleList) -> None:
        v4 = config.deepseek_v4
        assert v4 is not None
        super().__init__(config, layers, V4Norm(config.hidden_size, config.norm_eps))
        self.hc_head = HyperHead(config.hidden_size, v4.hc_mult, v4.hc_eps, config.norm_eps)


class DeepseekV4ForCausalLM(CausalLM):
    model: V4Backbone

    def __init__(self, config: ModelConfig) -> None:
        v4 = config.deepseek_v4
        if v4 is None or config.moe is None or config.sliding_window is None:
            raise ValueError("deepseek_v4 models need their DeepseekV4Config and MoE config")
        super().__init__(config)
        n = config.num_layers
        counts = {kind: v4.attention.count(kind) for kind in ("csa", "hca")}
        kinds = [kind for kind in ("csa", "hca") if counts[kind]]
        # groups: 0 the window of every layer; per compressed kind its entries, then (after
        # all of those) its pending projections
        entry_group = {kind: 1 + i for i, kind in enumerate(kinds)}
        buffer_group = {kind: 1 + len(kinds) + i for i, kind in enumerate(kinds)}
        layers: list[V4Layer] = []
        seen = dict.fromkeys(kinds, 0)
        shapes: dict[str, V4Compressed] = {}
        for i, kind in enumerate(v4.attention):
            slots = V4Slots(LayerSlot(0, i))
            if kind != "sliding":
                slots = V4Slots(LayerSlot(0, i), LayerSlot(entry_group[kind], seen[kind]),
                                LayerSlot(buffer_group[kind], seen[kind]))  # fmt: skip
                seen[kind] += 1
            layers.append(V4Layer(config, kind, v4.hash_layers[i], slots))
            if layers[-1].self_attn.compressor is not None:
                shapes[kind] = layers[-1].self_attn.compressor
        specs: list[CacheSpec] = [LatentSpec(n, config.head_dim, config.sliding_window)]
        specs += [EntrySpec(counts[k], shapes[k].entry_width, shapes[k].ratio) for k in kinds]
        specs += [BufferSpec(counts[k], shapes[k].buffer_tokens, shapes[k].all_width)
                  for k in kinds]  # fmt: skip
        self.cache_specs = tuple(specs)
        self.plain_specs = self.cache_specs
        self.slots = tuple(LayerSlot(0, i) for i in range(n))
        self.layer_groups = tuple(
            (0,) if kind == "sliding" else (0, entry_group[kind], buffer_group[kind])
            for kind in v4.attention
        )
        self.model = V4Backbone(config, nn.ModuleList(layers))
        self.main_rotary = V4Rotary(config.rope, v4.rope_dim)
        self.compress_rotary = V4Rotary(v4.compress_rope, v4.rope_dim)
        # MTP layers (dropped at load when the checkpoint has none); each keeps its window as
        # one more layer of group 0, declared only by a runner that drafts (`drafting_specs`)
        self.mtp = nn.ModuleList(
            V4MtpLayer(config, V4Slots(LayerSlot(0, n + k))) for k in range(config.num_mtp_layers)
        )
        self._streams: torch.Tensor | None = None

    def checkpoint_name(self, name: str) -> str | None:
        return v4_checkpoint_name(name)

    def optional_missing(self, missing: set[str]) -> set[str]:
        """A checkpoint without MTP weights (transformers saves none) loads without the MTP
        layers; one with some of them must have all."""
        mtp = {name for name, _ in self.mtp.named_parameters(prefix="mtp")}
        if mtp and mtp <= missing:
            self.mtp = nn.ModuleList()
            return missing - mtp
        return missing

    def drafting_specs(self, num_drafts: int) -> tuple[CacheSpec, ...]:
        """The cache groups with the MTP layers' windows in group 0, and compressor states
        that can drop `num_drafts` rejected tokens (`State.rewind`)."""
        window, *rest = self.plain_specs
        assert isinstance(window, LatentSpec)
        specs: list[CacheSpec] = [replace(window, num_layers=window.num_layers + len(self.mtp))]
        for spec in rest:
            if isinstance(spec, BufferSpec):
                spec = replace(spec, tokens=spec.tokens + num_drafts, rewind=num_drafts)
            specs.append(spec)
        return tuple(specs)

    def draft_source(self, hidden: torch.Tensor) -> torch.Tensor:
        """What an MTP layer pairs token i + 1 with: the last forward's final streams at i."""
        assert self._streams is not None and self._streams.shape[0] == hidden.shape[0]
        return self._streams

    def mtp_step(
        self, depth: int, ids: torch.Tensor, previous: torch.Tensor, ctx: StepContext
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """MTP layer `depth` on (token i, streams `previous` at i-1) at the positions of `ctx`
        (window group only): (hidden whose `logits` predict token i + 1, streams to chain)."""
        layer: V4MtpLayer = self.mtp[depth]  # type: ignore[assignment]
        return layer.draft(self.embed(ids), previous, ids, ctx, self.main_rotary)

    def forward(self, input_ids: torch.Tensor, ctx: StepContext) -> torch.Tensor:
        v4 = self.config.deepseek_v4
        assert v4 is not None
        rows = step_rows(ctx)
        x = self.embed(input_ids)
        streams = x[:, None, :].expand(-1, v4.hc_mult, -1).contiguous()
        layers: list[V4Layer] = list(self.model.layers)  # type: ignore[arg-type]
        for layer in layers:
            rotary = self.compress_rotary if layer.uses_compress_rope else self.main_rotary
            streams = layer(streams, input_ids, ctx, rows, rotary)
        self._streams = streams if len(self.mtp) else None
        out: torch.Tensor = self.model.norm(self.model.hc_head(streams))
        return out


def step_rows(ctx: StepContext) -> list[Row]:
    """The step's rows from the window group's token layout (every row has a query)."""
    batch = ctx.batches[0]
    assert isinstance(batch, AttentionBatch)
    rows = []
    for b in range(batch.query_index.shape[0]):
        tokens = torch.nonzero(batch.token_rows == b)[:, 0]
        positions = ctx.positions[tokens]
        rows.append(Row(tokens, positions, int(positions[0]), int(positions[-1]) + 1))
    return rows
