"""GLM-5.3-Flash (`glm5_next`, text path) on the fast runner: a first, correctness-first
version of the reference runner's model (`resin_models_torch/glm5_next.py`, whose docstring
has the math), equal to it in the Triton interpreter (float32).

- KDA layers ("linear"): one fused projection `[q | k | v | f_a | g_a | b]` of the layer
  input, the float32 causal conv over q|k|v with its state (`kernels/conv1d.py`, the conv
  kept in float32 to the SiLU), the forget gate's low-rank map and bounded sigmoid (torch,
  float32), the per-key-channel delta rule (`kernels/delta_rule.py`'s `kda_delta_rule`:
  the chunked kernel for prefill, `KimiDeltaAttention.prefill_chunk` tokens a chunk; the
  recurrent one for decode), the sigmoid-gated float32 norm (`kernels/gated_rmsnorm.py`),
  o_proj. Each layer's checkpoint is laid out as Qwen3.5's (`qwen3_5_moe.state_views`): one
  State group, checkpoints planned by the engine, so a shared prefix resumes from the KDA
  state at its end.
- Indexed MLA layers ("full"): q LoRA, the normed latent and the indexer's per-token key and
  pool-gate score are appended to one History group (a token's vector `[latent | key |
  gate]`, `cache_token_shape`); after a page's tokens, the pooled indexer key of each
  16-token pool it holds (`pool_view`), pooled once by `kernels/compressor.py`'s paged gated
  softmax when the pool's last token arrives (`_store_pools`, prefill chunks and decode
  alike), so a prefix hit's shared pages bring their pools. One pass for every query token
  of the step, read from the pages in place: `kernels/indexer.py`'s `paged_indexer_scores`
  scores the stored pools, `indexer_topk` keeps the best `index_topk / index_kpool`, and
  `kernels/sparse_attention.py` (the kernel DeepSeek-V4's
  attention runs, in its pooled mode) attends absorbed over those pools and the query's own
  incomplete pool: q_nope times W_uk against the latents, softmax in float32, W_uv after.
  `IndexedMla.stored_pools = False` (an A/B switch for benchmarks) pools every complete
  pool again each step instead; `IndexedMla.sparse_kernel = False` runs the torch path the
  kernel replaced (below). Why not a `Compressed(16)` group for the pools: its pages would be
  whole arena pages, as many as the History group's (`cache_groups`).
- mHC (`kernels/mhc.py`'s Sinkhorn weights; the collapse and mix in torch); the final
  collapse is the streams' mean.
- Names: the runners' (`checkpoint_names.names_for`, through `hf_glm5_next.rename_published`,
  maps the published `hc_attn_fn`, `self_attn.dt_bias` onto `attn_hc.fn`,
  `self_attn.decay.dt_bias`; `resin bench checkpoint` writes these).
- MLPs: the clamped SwiGLU (`silu_clamp` activation) dense, and the MoE layer library for
  the sigmoid-routed experts with the shared expert folded in (DeepSeek-V3's routing).

Decode steps are graph-safe (CUDA graphs): their pool bound is `decode_tokens` (the longest
sequence, rounded to whole pages and pools), the row lengths come from the decode buffers and a
padding row queries position -1 (it reads nothing); nothing is read on the host. Varlen steps
read the rows' bounds on the host once (`Glm5Next._queries`). The torch path
(`sparse_kernel = False`): decode over every row's first `decode_tokens` positions gathered
through the page table, what a row does not hold masked (graph-safe too); prefill a row at a
time, `kv_b_proj` expanding the row's latents as the reference does.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import torch
import torch.nn.functional as F

from resin.protocols import CacheGroupSpec, History, State
from resin_model.config import Glm5NextConfig, ModelConfig
from resin_models_cuda.kernels.compressor import gated_pool, paged_gated_pool
from resin_models_cuda.kernels.conv1d import causal_conv1d, conv_state_store
from resin_models_cuda.kernels.delta_rule import kda_delta_rule
from resin_models_cuda.kernels.gated_rmsnorm import gated_rmsnorm
from resin_models_cuda.kernels.indexer import (
    indexer_scores,
    indexer_select,
    indexer_topk,
    paged_indexer_scores,
    visible_entries,
)
from resin_models_cuda.kernels.mhc import hc_weights
from resin_models_cuda.kernels.mla import latent_append
from resin_models_cuda.kernels.sparse_attention import (
    PagedKeys,
    default_splits,
    pooled_sparse_attention,
)
from resin_models_cuda.layers import GatedMLP, MoE, RMSNorm, WeightSource
from resin_models_cuda.layers.quantized import float32_tensor, linear
from resin_models_cuda.models.base import BuildOptions, FastModel
from resin_models_cuda.models.llama import qwen_experts
from resin_models_cuda.models.qwen3_5_moe import state_layer_bytes, state_views
from resin_models_cuda.step import DecodeInfo, GroupTensors, LayerSlot, PrefillInfo, StepTensors


class ClampedMLP(GatedMLP):
    """The dense clamped SwiGLU: down(silu(min(gate, l)) * clamp(up, -l, l))."""

    def __init__(self, w: WeightSource, prefix: str, hidden: int, inner: int, limit: float):
        super().__init__(w, prefix, hidden, inner, "silu")
        self.act, self.limit = "silu_clamp", limit

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        from resin_models_cuda.kernels.activation import gated_activation

        return self.down(gated_activation(self.gate_up(x), self.act, limit=self.limit))


def glm5_moe(config: ModelConfig, glm: Glm5NextConfig, w: WeightSource, prefix: str,
             options: BuildOptions) -> MoE:  # fmt: skip
    """The sparse layer's experts (`prefix`: `...mlp.`): float32 router and correction bias,
    the shared experts as always-chosen ones, every SwiGLU clamped."""
    moe = config.moe
    assert moe is not None
    hidden = config.hidden_size
    experts = qwen_experts(config, w, prefix)
    router = float32_tensor(w, f"{prefix}gate.weight", (moe.num_experts, hidden))
    bias = float32_tensor(w, f"{prefix}gate.e_score_correction_bias", (moe.num_experts,), "zeros")
    experts = replace(experts, router=router, score_bias=bias)
    inner = moe.shared_intermediate_size
    shared = GatedMLP(w, f"{prefix}shared_experts.", hidden, inner, "silu")
    experts = experts.with_shared(shared.gate_up.weight, shared.down.weight)
    clamped = replace(moe, swiglu_limit=glm.swiglu_limit)
    return MoE(clamped, experts, "silu_clamp", options.moe_gemv_max_pairs, fp32_router=True)


class KimiDeltaAttention:
    """`prefix` is the layer's `...self_attn.`; `index` its place among the KDA layers.
    Prefill steps run the chunked delta rule, `prefill_chunk` tokens a chunk (16, 32 or 64;
    0: the recurrent kernel, which decode always runs; 16 measured fastest, docs/benchmarks.md)."""

    prefill_chunk = 16

    def __init__(
        self, config: ModelConfig, glm: Glm5NextConfig, w: WeightSource, prefix: str, index: int
    ) -> None:
        lin = config.linear_attention
        assert lin is not None
        self.lin, self.glm, self.eps = lin, glm, config.norm_eps
        hidden, heads, dim = config.hidden_size, lin.num_v_heads, lin.v_head_dim
        width = heads * dim
        self.heads, self.dim = heads, dim
        parts = ("q_proj", "k_proj", "v_proj", "f_a_proj", "g_a_proj", "b_proj")
        shapes = [(width, hidden)] * 3 + [(dim, hidden)] * 2 + [(heads, hidden)]
        self.in_proj = linear(w, [f"{prefix}{p}.weight" for p in parts], shapes)
        self.f_b = w.get(f"{prefix}f_b_proj.weight", (width, dim))
        self.g_b = w.get(f"{prefix}g_b_proj.weight", (width, dim))
        f32 = torch.float32
        convs = [w.get(f"{prefix}{p}_conv1d.weight", (width, 1, lin.conv_kernel), dtype=f32)
                 for p in "qkv"]  # fmt: skip
        self.conv = torch.cat(convs)[:, 0].contiguous()
        self.dt_bias = w.get(f"{prefix}decay.dt_bias", (width,), "zeros", dtype=f32)
        self.a_log = w.get(f"{prefix}decay.A_log", (heads,), "zeros", dtype=f32)
        self.norm = w.get(f"{prefix}o_norm.weight", (dim,), "ones")
        self.o_proj = linear(w, [f"{prefix}o_proj.weight"], [(hidden, width)], "out")
        self.offset = index * state_layer_bytes(config, w.dtype)

    def forget_gate(self, f: torch.Tensor) -> torch.Tensor:
        """Log decays float32 [T, heads, dim] (<= 0) of the low-rank gate input `f`."""
        raw = F.linear(f, self.f_b).float() + self.dt_bias
        raw = raw.view(f.shape[0], self.heads, self.dim)
        rate = self.a_log.exp()[None, :, None]
        lower = self.glm.gate_lower_bound
        if lower is not None:
            return lower * torch.sigmoid(rate * raw)
        softplus = torch.where(raw > 20.0, raw, torch.log(1.0 + torch.exp(raw)))
        return -rate * softplus

    def __call__(self, x: torch.Tensor, step: StepTensors) -> torch.Tensor:
        rows = step.state
        assert rows is not None, "a KDA layer needs the step's State rows"
        width, dim = self.heads * self.dim, self.dim
        proj = self.in_proj(x)
        mixed_in = proj[:, : 3 * width]
        f = proj[:, 3 * width : 3 * width + dim]
        g_in = proj[:, 3 * width + dim : 3 * width + 2 * dim]
        b = proj[:, 3 * width + 2 * dim :]
        conv_state, recurrent = state_views(self.lin, self.offset, rows.region, x.dtype)
        mixed = causal_conv1d(mixed_in, self.conv, conv_state, rows, round_conv=False)
        conv_state_store(mixed_in, conv_state, rows)
        decay = self.forget_gate(f).contiguous()
        chunk = self.prefill_chunk if isinstance(step.info, PrefillInfo) else 0
        o = kda_delta_rule(mixed, decay, b, recurrent, rows, chunk=chunk)
        gate = F.linear(g_in, self.g_b)
        return self.o_proj(gated_rmsnorm(o, gate, self.norm, self.eps, sigmoid=True))


@dataclass(frozen=True, slots=True)
class _Row:
    lo: int  # flat query tokens lo .. hi - 1
    hi: int
    total: int  # tokens cached after the step


@dataclass(frozen=True, slots=True)
class _Queries:
    """What the indexed MLA layers of one step share: per query token its row and position
    (int32 [T]; a decode padding row's position is -1, which reads nothing), per row the
    tokens it holds after the step (int32 [B]), `pools` the bound on any row's complete pools
    (a decode step's from `decode_tokens`: no host read), the kernel's `splits`, and a varlen
    step's rows (None: a decode step, one query a row). For the stored pools: per row the
    complete pools it held before the step (`first`, int32 [B]) and a bound on the pools any
    row completes in the step (`new_pools`: 1 in a decode step)."""

    token_row: torch.Tensor
    positions: torch.Tensor
    lens: torch.Tensor
    pools: int
    splits: int
    rows: list[_Row] | None
    first: torch.Tensor
    new_pools: int


class IndexedMla:
    """Latent attention without rotary over the keys the DSA indexer picks; `prefix` is the
    layer's `...self_attn.`, `slot` its place in the History group. `sparse_kernel` (an A/B
    switch for benchmarks): True runs every step on `kernels/sparse_attention.py`'s pooled
    mode; False the torch attention (decode over every row's first `decode_tokens`
    positions, prefill a row at a time)."""

    sparse_kernel = True
    stored_pools = True

    def __init__(
        self, config: ModelConfig, glm: Glm5NextConfig, w: WeightSource, prefix: str,
        slot: LayerSlot,
    ) -> None:  # fmt: skip
        mla = config.mla
        assert mla is not None and mla.q_lora_rank is not None
        self.mla, self.glm, self.slot, self.scale = mla, glm, slot, config.scale
        h, heads, rank = config.hidden_size, config.num_heads, mla.q_lora_rank
        d, ip = glm.index_head_dim, f"{prefix}indexer."
        self.heads = heads
        names = [
            f"{prefix}q_a_proj.weight",
            f"{prefix}kv_a_proj_with_mqa.weight",
            f"{ip}wk.weight",
            f"{ip}index_kpool_compress_gate",
            f"{ip}weights_proj.weight",
        ]
        shapes = [(rank, h), (mla.kv_lora_rank, h), (d, h), (d, h), (glm.index_heads, h)]
        self.in_proj = linear(w, names, shapes)  # fmt: skip
        self.splits = [s[0] for s in shapes]
        eps = config.norm_eps
        self.q_a_norm = RMSNorm(w, f"{prefix}q_a_layernorm.weight", rank, eps)
        self.kv_a_norm = RMSNorm(w, f"{prefix}kv_a_layernorm.weight", mla.kv_lora_rank, eps)
        self.q_b = w.get(f"{prefix}q_b_proj.weight", (heads * mla.nope_dim, rank))
        self.kv_b = w.get(
            f"{prefix}kv_b_proj.weight", (heads * (mla.nope_dim + mla.v_head_dim), mla.kv_lora_rank)
        )
        per_head = self.kv_b.view(heads, mla.nope_dim + mla.v_head_dim, mla.kv_lora_rank)
        self.w_uk, self.w_uv = per_head[:, : mla.nope_dim], per_head[:, mla.nope_dim :]
        self.o_proj = linear(w, [f"{prefix}o_proj.weight"], [(h, heads * mla.v_head_dim)], "out")
        self.index_q = w.get(f"{ip}wq_b.weight", (glm.index_heads * d, rank))
        self.k_norm_w = w.get(f"{ip}k_norm.weight", (d,), "ones")
        self.k_norm_b = w.get(f"{ip}k_norm.bias", (d,), "zeros")
        self.ape = w.get(f"{ip}index_kpool_compress_ape", (glm.index_kpool, d), "zeros",
                         dtype=torch.float32)  # fmt: skip

    def __call__(
        self, x: torch.Tensor, step: StepTensors, model: Glm5Next, view: _Queries
    ) -> torch.Tensor:
        mla, glm, t = self.mla, self.glm, x.shape[0]
        q_a, latent, key, gate, head_w = self.in_proj(x).split(self.splits, dim=-1)
        q_resid = self.q_a_norm(q_a.contiguous())
        queries = F.linear(q_resid, self.q_b).view(t, self.heads, mla.nope_dim)
        latent = self.kv_a_norm(latent.contiguous())
        key = F.layer_norm(key, (key.shape[-1],), self.k_norm_w, self.k_norm_b, 1e-6)
        store = model.token_view(self.slot.index)
        group = step.groups[self.slot.group]
        entry = torch.cat((latent, key, gate), dim=-1).to(store.dtype)
        latent_append(entry, store[:, :, None], group.slots)
        index_q = F.linear(q_resid, self.index_q).view(t, glm.index_heads, -1).float()
        head_w = head_w.float() * glm.index_heads**-0.5
        if self.sparse_kernel:
            pools = model.pool_view(self.slot.index) if self.stored_pools else None
            out = self._sparse(queries, index_q, head_w, view, store, group, pools)
        elif view.rows is None:
            out = self._decode(queries, index_q, head_w, step, model, store, group)
        else:
            out = self._varlen(queries, index_q, head_w, step, model, store, group, view.rows)
        return self.o_proj(out.reshape(t, -1))

    def _sparse(
        self, queries: torch.Tensor, index_q: torch.Tensor, head_w: torch.Tensor,
        view: _Queries, store: torch.Tensor, group: GroupTensors, pools: torch.Tensor | None,
    ) -> torch.Tensor:  # fmt: skip
        """Every query token of the step at once, read from the History pages in place: the
        rows' complete pools scored (stored `pools`: `_store_pools` first writes those the
        step completes, then `paged_indexer_scores` reads them in place; None: every complete
        pool pooled again, `paged_gated_pool`, and scored, `indexer_scores`), the best
        `index_topk / index_kpool` kept (`indexer_topk`) and attended with the tail by the
        sparse kernel, absorbed (q_nope times W_uk over the latents, W_uv after)."""
        rank, pool = self.mla.kv_lora_rank, self.glm.index_kpool
        d, t, topk = self.glm.index_head_dim, queries.shape[0], self.glm.index_topk // pool
        table = (group.page_indptr, group.page_ids, group.page_start)
        selected = torch.full((t, 0), -1, dtype=torch.int32, device=queries.device)
        if view.pools:
            counts = view.lens // pool
            keys = PagedKeys(store[..., rank : rank + d], *table)
            gates = store[..., rank + d :]
            if pools is None:
                pooled = paged_gated_pool(keys, gates, self.ape, counts, view.pools)
                scores = indexer_scores(index_q, pooled, head_w, view.token_row, view.positions,
                                        counts, pool)  # fmt: skip
                selected = indexer_topk(scores, topk)
            else:
                self._store_pools(keys, gates, pools, view, group, counts)
                stored = PagedKeys(pools, group.page_indptr, group.page_ids)
                scores = paged_indexer_scores(
                    index_q.to(pools.dtype), stored, head_w, view.token_row, view.positions,
                    counts, pool, view.pools, fill=False,
                )  # fmt: skip
                visible = visible_entries(view.token_row, view.positions, counts, pool)
                selected = indexer_topk(scores, topk, visible)
        q_lat = torch.einsum("thd,hdr->thr", queries, self.w_uk)
        out = pooled_sparse_attention(q_lat, view.token_row, view.positions,
                                      PagedKeys(store, *table), selected, pool, self.scale,
                                      splits=view.splits)  # fmt: skip
        return torch.einsum("thr,hvr->thv", out, self.w_uv)

    def _store_pools(
        self, keys: PagedKeys, gates: torch.Tensor, pools: torch.Tensor, view: _Queries,
        group: GroupTensors, counts: torch.Tensor,
    ) -> None:  # fmt: skip
        """Pool the pools the step completes (row b's `view.first[b]` .. `counts[b] - 1`,
        their tokens read from the History pages, this step's already written) and write each
        once into its page's pool slots (`pools` [pages, E, d]: pool w of a row in the page
        of its tokens, slot w % E), in fixed shapes with no host read: a decode row pools
        the pool its token would complete and writes it only when the token completes it
        (slot -1 otherwise, skipped)."""
        n, per_page = view.new_pools, pools.shape[1]
        if not n or not group.page_ids.shape[0]:
            return
        pooled = paged_gated_pool(keys, gates, self.ape, counts, n, view.first)  # [B, n, d]
        b = counts.shape[0]
        w = view.first[:, None] + torch.arange(n, device=counts.device, dtype=torch.int32)
        page = _pages_at(group, b, w, per_page)
        slots = torch.where(w < counts[:, None], page * per_page + w % per_page, -1)
        latent_append(pooled.flatten(0, 1), pools[:, :, None], slots.flatten())

    def _select(
        self, entries: torch.Tensor, index_q: torch.Tensor, head_w: torch.Tensor,
        qpos: torch.Tensor, counts: torch.Tensor, token_row: torch.Tensor,
    ) -> torch.Tensor:  # fmt: skip
        """bool [Q, N]: the keys each query reads, of its row's entries [B, N, width] (N a
        multiple of the pool; pools past `counts[b]` complete ones are not read)."""
        glm, rank = self.glm, self.mla.kv_lora_rank
        d, pool = glm.index_head_dim, glm.index_kpool
        b, n = entries.shape[:2]
        kpos = torch.arange(n, device=entries.device)
        chosen = (kpos[None, :] <= qpos[:, None]) & (
            kpos[None, :] >= (qpos + 1 - (qpos + 1) % pool)[:, None]
        )  # the query's own incomplete pool, always read
        pools = n // pool
        if pools:
            keys = entries[:, : pools * pool, rank : rank + d].reshape(b * pools, pool, d)
            gates = entries[:, : pools * pool, rank + d :].reshape(b * pools, pool, d).float()
            pooled = gated_pool(keys, gates, self.ape).view(b, pools, d)
            scores = indexer_scores(index_q, pooled, head_w, token_row, qpos, counts, pool)
            picked = indexer_select(scores, glm.index_topk // pool)
            chosen[:, : pools * pool] |= picked.repeat_interleave(pool, dim=1)
        return chosen

    def _varlen(
        self, queries: torch.Tensor, index_q: torch.Tensor, head_w: torch.Tensor,
        step: StepTensors, model: Glm5Next, store: torch.Tensor, group: GroupTensors,
        rows: list[_Row],
    ) -> torch.Tensor:  # fmt: skip
        """A row at a time: `kv_b_proj` expands the row's latents (as the reference)."""
        mla, pool, dev = self.mla, self.glm.index_kpool, queries.device
        out = queries.new_empty((queries.shape[0], self.heads, mla.v_head_dim))
        positions = step.positions.long()
        for b, row in enumerate(rows):
            lo, hi, n = row.lo, row.hi, row.total
            entries = store[model.token_pages(group, b, n)].to(queries.dtype)
            zeros = torch.zeros(hi - lo, dtype=torch.int32, device=dev)
            counts = torch.full((1,), n // pool, dtype=torch.int32, device=dev)
            padded = F.pad(entries, (0, 0, 0, -n % pool))[None]
            chosen = self._select(padded, index_q[lo:hi], head_w[lo:hi], positions[lo:hi],
                                  counts, zeros)[:, :n]  # fmt: skip
            kv = F.linear(entries[:, : mla.kv_lora_rank], self.kv_b).view(n, self.heads, -1)
            k_nope, values = kv.split([mla.nope_dim, mla.v_head_dim], dim=-1)
            scores = torch.einsum("qhd,khd->hqk", queries[lo:hi], k_nope) * self.scale
            scores = scores.masked_fill(~chosen[None], float("-inf"))
            probs = torch.softmax(scores, dim=-1, dtype=torch.float32).to(queries.dtype)
            out[lo:hi] = torch.einsum("hqk,khd->qhd", probs, values)
        return out

    def _decode(
        self, queries: torch.Tensor, index_q: torch.Tensor, head_w: torch.Tensor,
        step: StepTensors, model: Glm5Next, store: torch.Tensor, group: GroupTensors,
    ) -> torch.Tensor:  # fmt: skip
        """One query a row over every row's first `model.decode_tokens` positions (fixed
        shapes, no host read: graph-safe); absorbed: q_nope times W_uk attends over the
        latents, W_uv maps the latent output back."""
        info = step.info
        assert isinstance(info, DecodeInfo) and info.query == 1
        rank, pool = self.mla.kv_lora_rank, self.glm.index_kpool
        b, n, ps = queries.shape[0], model.decode_tokens, model.page_size
        kpos = torch.arange(n, device=queries.device)
        pages = _pages_at(group, b, kpos[None, :], ps)
        entries = store[pages, kpos[None, :] % ps].to(queries.dtype)  # [B, N, width]
        seq_lens = info.seq_lens[:b]
        qpos = (seq_lens - 1).clamp(min=0).long()
        rows = torch.arange(b, dtype=torch.int32, device=queries.device)
        chosen = self._select(entries, index_q, head_w, qpos, seq_lens // pool, rows)
        chosen &= kpos[None, :] < seq_lens[:, None]
        latents = entries[..., :rank]
        q_lat = torch.einsum("bhd,hdr->bhr", queries, self.w_uk)
        scores = torch.einsum("bhr,bkr->bhk", q_lat, latents) * self.scale
        scores = scores.masked_fill(~chosen[:, None], float("-inf"))
        probs = torch.softmax(scores, dim=-1, dtype=torch.float32).to(queries.dtype)
        out_lat = torch.einsum("bhk,bkr->bhr", probs, latents)
        return torch.einsum("bhr,hvr->bhv", out_lat, self.w_uv)


def _pages_at(group: GroupTensors, rows: int, index: torch.Tensor, per_page: int) -> torch.Tensor:
    """int64 [rows, N]: the page holding item `index` [rows or 1, N] of each of the first
    `rows` rows, `per_page` items a page (tokens, or stored pools); clamped into the page table,
    so a padding row reads some page and writes nothing from it."""
    at = group.page_indptr[:rows, None] + index // per_page - group.page_start[:rows, None]
    return group.page_ids[at.clamp(0, group.page_ids.shape[0] - 1).long()].long()


class HyperConnection:
    """One sub-block's mHC (`prefix`: `...layers.{i}.attn_hc.` or `ffn_hc.`)."""

    def __init__(self, glm: Glm5NextConfig, w: WeightSource, prefix: str, hidden: int,
                 norm_eps: float) -> None:  # fmt: skip
        n, f32 = glm.hc_mult, torch.float32
        self.fn = w.get(f"{prefix}fn", ((2 + n) * n, n * hidden), dtype=f32)
        self.base = w.get(f"{prefix}base", ((2 + n) * n,), "zeros", dtype=f32)
        self.scale = w.get(f"{prefix}scale", (3,), "ones", dtype=f32)
        self.iterations, self.eps, self.norm_eps = glm.hc_iterations, glm.hc_eps, norm_eps

    def __call__(self, streams: torch.Tensor) -> tuple[torch.Tensor, ...]:
        flat = streams.flatten(1).float()
        flat = flat * torch.rsqrt(flat.square().mean(-1, keepdim=True) + self.norm_eps)
        mixes = F.linear(flat, self.fn).contiguous()
        pre, post, comb = hc_weights(mixes, self.scale, self.base, self.iterations, self.eps)
        return post, comb, (pre[..., None] * streams).sum(dim=1).to(streams.dtype)


def hc_mix(
    streams: torch.Tensor, post: torch.Tensor, comb: torch.Tensor, out: torch.Tensor
) -> torch.Tensor:
    """The new streams: `post` spreads the block's output, comb^T mixes the old streams."""
    dtype = streams.dtype
    mixed = torch.matmul(comb.to(dtype).transpose(-1, -2), streams)
    return post.to(dtype)[..., None] * out[:, None, :] + mixed


class Glm5NextLayer:
    def __init__(
        self, config: ModelConfig, glm: Glm5NextConfig, w: WeightSource, layer: int,
        mixer: KimiDeltaAttention | IndexedMla, options: BuildOptions,
    ) -> None:  # fmt: skip
        p, hidden, eps = f"model.layers.{layer}.", config.hidden_size, config.norm_eps
        self.attn_hc = HyperConnection(glm, w, f"{p}attn_hc.", hidden, eps)
        self.ffn_hc = HyperConnection(glm, w, f"{p}ffn_hc.", hidden, eps)
        self.input_norm = RMSNorm(w, f"{p}input_layernorm.weight", hidden, eps)
        self.post_norm = RMSNorm(w, f"{p}post_attention_layernorm.weight", hidden, eps)
        self.mixer = mixer
        self.mlp: MoE | ClampedMLP = (
            glm5_moe(config, glm, w, f"{p}mlp.", options)
            if config.is_sparse(layer)
            else ClampedMLP(w, f"{p}mlp.", hidden, config.intermediate_size, glm.swiglu_limit)
        )
        if isinstance(self.mlp, MoE) and options.cut_moe is not None:  # cut as it is built
            self.mlp = options.cut_moe(self.mlp)


class Glm5Next(FastModel):
    @property  # type: ignore[misc]
    def graph_prefill(self) -> bool:  # type: ignore[override]
        """Short prefills in graphs on the sparse kernel (the torch path's fixed-shape body,
        `IndexedMla._decode`, takes one query a row)."""
        return IndexedMla.sparse_kernel and FastModel.graph_prefill

    def __init__(self, config: ModelConfig, weights: WeightSource, options: BuildOptions) -> None:
        glm = config.glm5_next
        if glm is None or config.mla is None or config.linear_attention is None:
            raise ValueError("glm5_next needs its indexer, MLA and KDA configs")
        if config.moe is None:
            raise ValueError("glm5_next needs a MoE config")
        super().__init__(config, weights, options)
        self._rotary.clear()  # no positional encoding: no rotary tables
        self.glm = glm
        self.page_size = 16
        self.layers = []
        for layer, kind in enumerate(config.layer_types):
            prefix = f"model.layers.{layer}.self_attn."
            mixer: KimiDeltaAttention | IndexedMla
            if kind == "linear":
                index = self.slots[layer].index
                mixer = KimiDeltaAttention(config, glm, weights, prefix, index)
            else:
                mixer = IndexedMla(config, glm, weights, prefix, self.slots[layer])
            self.layers.append(Glm5NextLayer(config, glm, weights, layer, mixer, options))
        self._kv: torch.Tensor | None = None
        self._mla_layers = config.layer_types.count("full")
        self.decode_tokens = self.pools_per_page = 0
        self._num_sms = (
            torch.cuda.get_device_properties(self.device).multi_processor_count
            if self.device.type == "cuda"
            else 0
        )
        self.cache_groups(self.page_size)

    def cache_groups(self, page_size: int) -> tuple[CacheGroupSpec, ...] | None:
        """History, then State. Records the page size and the positions a decode step reads
        per row (whole pages and pools past the longest sequence). Where pools fit whole in a
        page (`page_size` a multiple of `index_kpool`), a History page also holds its pools'
        pooled indexer keys after its tokens (`pool_view`; `page_size / index_kpool` of them a
        layer, 128 x 2 bytes each at GLM-5.3-Flash's sizes: 1% over the tokens' 16 x 1,536):
        the model declares its groups and views each page flat (`token_view`, `pool_view`).
        Otherwise None (the default groups, no stored pools). Not a `Compressed(16)` group:
        every token page is `page_bytes`, and a Compressed page at ratio <= page size covers
        as many tokens as a History page, so it would double the pages for 1% more bytes."""
        pool = self.glm.index_kpool
        self.page_size = page_size
        unit = page_size * pool // math.gcd(page_size, pool)
        longest = min(self.options.max_positions, self.config.max_positions)
        self.decode_tokens = -(-longest // unit) * unit
        self.pools_per_page = 0 if page_size % pool else page_size // pool
        if not self.pools_per_page:
            self.layers_per_group = (self._mla_layers,)
            return None
        self.layers_per_group = (1,)  # one flat vector a page (`cache_token_shape`)
        return History(self._page_elements * self.dtype.itemsize), State(self.state_bytes())

    @property
    def _token_width(self) -> int:
        """A token's vector a layer: the latent, the indexer key, its pool-gate score."""
        mla = self.config.mla
        assert mla is not None
        return mla.kv_lora_rank + 2 * self.glm.index_head_dim

    @property
    def _pool_width(self) -> int:
        """A page's pooled indexer keys a layer (0 without stored pools)."""
        return self.pools_per_page * self.glm.index_head_dim

    @property
    def _page_elements(self) -> int:
        """A History page's elements over every MLA layer: its tokens' vectors, then its
        pools' keys."""
        return self._mla_layers * (self.page_size * self._token_width + self._pool_width)

    def state_bytes(self) -> int:
        linear = self.config.layer_types.count("linear")
        return linear * state_layer_bytes(self.config, self.dtype)

    def cache_token_shape(self) -> tuple[int, int, int]:
        """One vector a token and layer (`_token_width`); with stored pools the whole page as
        one flat vector a token of a one-layer group (`cache_groups`)."""
        if not self.pools_per_page:
            return 1, 1, self._token_width
        return 1, 1, -(-self._page_elements // self.page_size)

    def _pages(self) -> torch.Tensor:
        kv = self._kv
        assert kv is not None and kv.shape[3] == self.page_size
        return kv.view(kv.shape[0], -1)

    def token_view(self, index: int) -> torch.Tensor:
        """Layer `index` of the History group: [pages, page size, width] (a strided view)."""
        ps, width, layers = self.page_size, self._token_width, self._mla_layers
        tokens = self._pages()[:, : layers * ps * width]
        return tokens.view(-1, layers, ps, width)[:, index]

    def pool_view(self, index: int) -> torch.Tensor | None:
        """Layer `index`'s pooled indexer keys: [pages, pools a page, index_head_dim], pool w
        of a row in its page `w // E` at slot `w % E` (None without stored pools)."""
        if not self.pools_per_page:
            return None
        ps, layers, d = self.page_size, self._mla_layers, self.glm.index_head_dim
        at = layers * ps * self._token_width
        pools = self._pages()[:, at : at + layers * self._pool_width]
        return pools.view(-1, layers, self.pools_per_page, d)[:, index]

    def token_pages(self, group: object, b: int, n: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(page, offset) of row b's positions 0 .. n - 1 in its group's pages."""
        ps, positions = self.page_size, torch.arange(n, device=self.device)
        indptr, ids, start = group.page_indptr, group.page_ids, group.page_start  # type: ignore[attr-defined]
        page = ids[(indptr[b] + positions // ps - start[b]).long()].long()
        return page, positions % ps

    def _queries(self, step: StepTensors) -> _Queries:
        """The step's `_Queries` (a `DecodeInfo` step's from its fixed-shape tensors alone)."""
        info, t, pool = step.info, step.input_ids.shape[0], self.glm.index_kpool
        tokens = torch.arange(t, dtype=torch.int32, device=self.device)
        blocks = -(-self.config.num_heads // 16)
        splits = default_splits(t, blocks, self._num_sms) if self._num_sms else 1
        if isinstance(info, DecodeInfo) and info.query == 1:
            lens = info.seq_lens[:t]
            first = (lens - 1).clamp(min=0) // pool  # a padding row: 0 of 0, none completed
            return _Queries(tokens, lens - 1, lens, self.decode_tokens // pool, splits, None,
                            first, 1)  # fmt: skip
        if isinstance(info, DecodeInfo):  # several slots a row (a short prefill's): row b's
            # first q_lens[b] real, the rest padding at position -1 (reads nothing)
            assert info.q_lens is not None
            query, lens = info.query, info.seq_lens
            row = tokens // query
            real = tokens % query < info.q_lens[row.long()]
            positions = torch.where(real, step.positions, -1)
            first = ((lens - info.q_lens).clamp(min=0) // pool).int()
            new = -(-query // pool)  # a bound on the pools a row's tokens complete
            return _Queries(row, positions, lens, self.decode_tokens // pool, splits, None,
                            first, new)  # fmt: skip
        indptr, cached = info.query_indptr.tolist(), info.cached_lens.tolist()
        rows = [
            _Row(lo, hi, c + hi - lo)
            for lo, hi, c in zip(indptr[:-1], indptr[1:], cached, strict=True)
        ]
        token_row = torch.searchsorted(info.query_indptr[1:], tokens, right=True).int()
        lens = (info.cached_lens + info.query_indptr.diff()).int()
        most = max((row.total for row in rows), default=0)
        new = max((r.total // pool - c // pool for r, c in zip(rows, cached, strict=True)),
                  default=0)  # fmt: skip
        first = (info.cached_lens // pool).int()
        return _Queries(token_row, step.positions, lens, most // pool, splits, rows, first, new)

    def forward(self, step: StepTensors, kv: torch.Tensor) -> torch.Tensor:
        self._kv = kv
        view = self._queries(step)
        x = self.embed_tokens(step.input_ids)
        streams = x[:, None, :].expand(-1, self.glm.hc_mult, -1).contiguous()
        for layer in self.layers:
            post, comb, h = layer.attn_hc(streams)
            h = layer.input_norm(h)
            if isinstance(layer.mixer, KimiDeltaAttention):
                out = layer.mixer(h, step)
            else:
                out = layer.mixer(h, step, self, view)
            streams = hc_mix(streams, post, comb, out)
            post, comb, h = layer.ffn_hc(streams)
            streams = hc_mix(streams, post, comb, layer.mlp(layer.post_norm(h)))
        return self.final_norm(streams.mean(dim=1))
