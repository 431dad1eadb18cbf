"""DeepSeek-V4 (Flash) on the fast runner: a first, correctness-first version.

The model declares the reference runner's cache groups byte for byte (`cache_groups`): the
Window group of every layer's K=V vectors, a Compressed group per compressed kind present
(CSA: the K=V entry then the indexer key; HCA: the K=V entry) and a State group per kind
holding the compressor projections entries to come still need, a ring over positions (slot
p % capacity). It views the runner's token arena per group (the arena is one flat vector a
page, `cache_token_shape`) and the State region per group (`step.states`). Decode steps
(`DecodeInfo`: one query token a row, or a token and the MTP drafts it verifies, padded to a
graph bucket) run in fixed shapes with no host read, so the runner captures them in CUDA
graphs: the row lengths come from the decode buffers, the indexer scores up to the context
limit's entries (`longest`), each token pools the entry it would complete and writes it at
its `entry_at` slot, and each row rewrites its whole State ring, every write through a kernel
that skips slot -1 (`_put`; padding and tokens that complete nothing). Other steps (prefill,
checkpoints) run eagerly on varlen tensors. A State page keeps room
for `max_draft_tokens` more positions (`State.rewind`), and a step writes what every length
from `total - rewind` on needs, so rows verify drafts (the engine may keep fewer tokens).

Kernels: the attention (`kernels/sparse_attention.py`: every query token of the step over its
window's pages and its compressed entries' pages in one launch a layer, CSA reading the
indexer's picks, HCA every visible entry), mHC's Sinkhorn weights and the final collapse's
(`kernels/mhc.py`), the compressor's gated pooling (`kernels/compressor.py`), the indexer's
scores, read in place from the entry pages, and its radix top-k (`kernels/indexer.py`; ties
to the lowest entries) and the MoE through the layer library (`V4Moe`: the router kernel's
`sqrt(softplus)` / hash routing, the expert GEMV / grouped kernels in bf16 or FP8). The
compressor's bookkeeping (which positions each entry pools, the State rings, checkpoints) is
batched over the step's rows with index tensors on the device (`_Attention._update`); a
varlen step reads the host only for the row lengths (`_begin`). Still plain torch here: the
projections (dense matmuls), norms and rotary. The math and its float32 points are the
reference runner's (`resin_models_torch/deepseek_v4.py`), which the tests compare against in
the Triton interpreter."""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch
import torch.nn.functional as F

from resin.protocols import CacheGroupSpec, Compressed, State, Window
from resin_model.config import AttentionKind, ModelConfig, RopeConfig
from resin_models_cuda.kernels.activation import gated_activation
from resin_models_cuda.kernels.compressor import gated_pool
from resin_models_cuda.kernels.indexer import (
    indexer_topk,
    paged_indexer_scores,
    visible_entries,
)
from resin_models_cuda.kernels.mhc import hc_head_weights, hc_weights
from resin_models_cuda.kernels.mla import latent_append
from resin_models_cuda.kernels.sparse_attention import (
    PagedKeys,
    default_splits,
    sparse_attention,
)
from resin_models_cuda.layers import ExpertWeights, GatedMLP, MoE, WeightSource
from resin_models_cuda.layers.quantized import float32_tensor, stacked_fp4_experts
from resin_models_cuda.layers.weights import RandomWeights
from resin_models_cuda.models.base import BuildOptions, FastModel
from resin_models_cuda.models.llama import qwen_experts
from resin_models_cuda.step import DecodeInfo, PrefillInfo, StateRows, StepTensors


def _norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMS norm with the float32 weight applied before the cast back (V4's)."""
    xf = x.float()
    return (weight * (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps))).to(x.dtype)


def _unweighted(x: torch.Tensor, eps: float) -> torch.Tensor:
    scale = torch.rsqrt(x.float().square().mean(-1, keepdim=True) + eps)
    return x * scale.to(x.dtype)


class _Rotary:
    """Interleaved-pair rotary on the trailing `dim` channels (float32 tables)."""

    def __init__(self, rope: RopeConfig, dim: int, device: torch.device) -> None:
        self.inv_freq = rope.inv_freq(dim).to(device)
        self.factor = rope.attention_factor

    def cos_sin(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        freqs = positions[:, None].float() * self.inv_freq[None, :]
        return freqs.cos() * self.factor, freqs.sin() * self.factor


def _rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    r = 2 * cos.shape[-1]
    shape = (cos.shape[0],) + (1,) * (x.dim() - 2) + (r,)
    cos = cos.to(x.dtype).repeat_interleave(2, dim=-1).float().view(shape)
    sin = sin.to(x.dtype).repeat_interleave(2, dim=-1).float().view(shape)
    nope, rope = x[..., :-r], x[..., -r:].float()
    turned = torch.stack((-rope[..., 1::2], rope[..., 0::2]), dim=-1).flatten(-2)
    return torch.cat((nope, (rope * cos + turned * sin).to(x.dtype)), dim=-1)


class _Slots:
    """A layer's view of its group's pages [pages, per page, width], read and written by flat
    arena slot (page * per page + offset) without copying the strided view."""

    def __init__(self, pages: torch.Tensor) -> None:
        self.pages, self.per_page = pages, pages.shape[1]
        self.dtype = pages.dtype

    def __getitem__(self, slots: torch.Tensor) -> torch.Tensor:
        slots = slots.long()
        return self.pages[slots // self.per_page, slots % self.per_page]

    def __setitem__(self, slots: torch.Tensor, values: torch.Tensor) -> None:
        slots = slots.long()
        self.pages[slots // self.per_page, slots % self.per_page] = values

    def put(self, slots: torch.Tensor, values: torch.Tensor) -> None:
        """`values` [N, width] at `slots` [N], a slot of -1 skipped (one kernel launch, no
        host read: a decode step's padding rows and rows that complete no entry)."""
        _put(self.pages, slots, values)


def _put(pages: torch.Tensor, slots: torch.Tensor, values: torch.Tensor) -> None:
    """`values` [N, width] at flat slots [N] (page * per page + offset, -1 skipped) of `pages`
    [pages, per page, width]."""
    latent_append(values.contiguous(), pages[:, :, None, :], slots)


@dataclass(frozen=True, slots=True)
class _StepView:
    """What every attention layer of a step shares, on the device: each token's row, each
    row's length after the step; on the host: a bound on the longest row (the longest row in
    a varlen step, the context limit in a fixed-shape decode step), the attention's split
    count and whether it is a decode step."""

    token_row: torch.Tensor  # int32 [T]
    total_lens: torch.Tensor  # int32 [B] (0: a decode step's padding row)
    max_total: int
    splits: int
    decode: bool  # one query token a row (the compressors skip checking the plan)
    fixed: bool = False  # a `DecodeInfo` step: fixed shapes, no host read (CUDA graphs)


class _Pooler:
    """One compressor (`prefix`: `...compressor.` or `...compressor.indexer.`): `width`
    values an entry, `ratio` tokens a block, CSA's overlap when `overlap`."""

    def __init__(
        self, w: WeightSource, prefix: str, hidden: int, width: int, ratio: int, overlap: bool
    ) -> None:
        proj = 2 * width if overlap else width
        self.width, self.ratio, self.overlap = width, ratio, overlap
        self.kv = w.get(f"{prefix}kv_proj.weight", (proj, hidden))
        self.gate = w.get(f"{prefix}gate_proj.weight", (proj, hidden))
        self.bias = w.get(f"{prefix}position_bias", (ratio, proj), dtype=torch.float32)
        self.norm = w.get(f"{prefix}kv_norm.weight", (width,), "ones", dtype=torch.float32)
        self.projected = 2 * proj  # values a token keeps in the State group

    def project(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cat((F.linear(x, self.kv), F.linear(x, self.gate)), dim=-1)

    def start(self, length: int) -> int:
        complete = length // self.ratio
        return max(0, complete - 1 if self.overlap else complete) * self.ratio

    def buffer_tokens(self) -> int:
        return max(1, (2 * self.ratio if self.overlap else self.ratio) - 1)

    def span(self) -> int:
        """Positions one entry pools: the previous block's too with the overlap."""
        return 2 * self.ratio if self.overlap else self.ratio

    def pool(
        self, tokens: torch.Tensor, windows: torch.Tensor, rot: _Rotary, eps: float
    ) -> torch.Tensor:
        """Entries `windows` [N] from each one's projections [N, span, 2 x proj] of positions
        (w + 1) m - span .. (w + 1) m - 1: with the overlap the previous block's first
        half-channels then the block's second (none before entry 0), else the block's."""
        m, w = self.ratio, self.width
        kv, gate = tokens.chunk(2, dim=-1)
        gate, bias = gate.float(), self.bias
        if self.overlap:
            none = (windows == 0)[:, None, None]
            prev_kv = kv[:, :m, :w].masked_fill(none, 0.0)
            prev_gate = gate[:, :m, :w].masked_fill(none, float("-inf"))
            kv = torch.cat((prev_kv, kv[:, m:, w:]), dim=1)
            gate = torch.cat((prev_gate, gate[:, m:, w:]), dim=1)
            bias = torch.cat((bias[:, :w], bias[:, w:]))
        pooled = _norm(gated_pool(kv, gate, bias), self.norm, eps)
        return _rope(pooled, *rot.cos_sin(windows * m))


class _Attention:
    def __init__(
        self, c: ModelConfig, w: WeightSource, prefix: str, kind: AttentionKind, slots: list[int]
    ) -> None:
        v4 = c.deepseek_v4
        assert v4 is not None
        p, h, heads, d = f"{prefix}self_attn.", c.hidden_size, c.num_heads, c.head_dim
        self.v4, self.kind, self.slots, self.eps = v4, kind, slots, c.norm_eps
        self.heads, self.dim, self.window = heads, d, int(c.sliding_window or 0)
        f32 = torch.float32
        self.q_a = w.get(f"{p}q_a_proj.weight", (v4.q_lora_rank, h))
        self.q_a_norm = w.get(f"{p}q_a_norm.weight", (v4.q_lora_rank,), "ones", dtype=f32)
        self.q_b = w.get(f"{p}q_b_proj.weight", (heads * d, v4.q_lora_rank))
        self.kv = w.get(f"{p}kv_proj.weight", (d, h))
        self.kv_norm = w.get(f"{p}kv_norm.weight", (d,), "ones", dtype=f32)
        g, rank = v4.o_groups, v4.o_lora_rank
        self.o_a = w.get(f"{p}o_a_proj.weight", (g * rank, heads * d // g)).view(g, rank, -1)
        self.o_b = w.get(f"{p}o_b_proj.weight", (h, g * rank), "out")
        self.sinks = w.get(f"{p}sinks", (heads,), "zeros", dtype=f32)
        self.pooler = self.indexer = None
        if kind != "sliding":
            ratio = v4.csa_ratio if kind == "csa" else v4.hca_ratio
            self.pooler = _Pooler(w, f"{p}compressor.", h, d, ratio, kind == "csa")
        if kind == "csa":
            ip = f"{p}compressor.indexer."
            self.indexer = _Pooler(w, ip, h, v4.index_head_dim, v4.csa_ratio, True)
            dim = v4.index_head_dim
            self.index_q = w.get(f"{ip}q_b_proj.weight", (v4.index_heads * dim, v4.q_lora_rank))
            self.index_w = w.get(f"{ip}scorer.weights_proj.weight", (v4.index_heads, h))

    def __call__(
        self,
        x: torch.Tensor,
        step: StepTensors,
        arena: DeepseekV4,
        rot: _Rotary,
    ) -> torch.Tensor:
        cos, sin = rot.cos_sin(step.positions)
        t = x.shape[0]
        q_res = _norm(F.linear(x, self.q_a), self.q_a_norm, self.eps)
        q = F.linear(q_res, self.q_b).view(t, self.heads, self.dim)
        q = _rope(_unweighted(q, self.eps), cos, sin)
        kv = _rope(_norm(F.linear(x, self.kv), self.kv_norm, self.eps), cos, sin)
        window = arena.window_view(self.slots[0])
        group = step.groups[0]
        view = arena.view
        if view.fixed:
            window.put(group.slots, kv)
        else:
            window[group.slots] = kv.to(window.dtype)
        keys = PagedKeys(window.pages, group.page_indptr, group.page_ids, group.page_start)
        if self.pooler is None:
            out = sparse_attention(q, self.sinks, view.token_row, step.positions, keys,
                                   self.window, splits=view.splits)  # fmt: skip
        else:
            if view.fixed:
                self._update_decode(x, step, arena)
            else:
                self._update(x, step, arena)
            ratio = self.pooler.ratio
            store = arena.entry_view(self.slots[1], self.slots[3])
            eg = step.groups[self.slots[1]]
            entries = PagedKeys(store.pages, eg.page_indptr, eg.page_ids)
            counts = view.total_lens // ratio
            selected = None
            if self.indexer is not None:
                most = view.max_total // ratio
                selected = self._select(x, q_res, step, entries, counts, most, view.token_row,
                                        rot)  # fmt: skip
            out = sparse_attention(
                q, self.sinks, view.token_row, step.positions, keys, self.window, entries,
                counts, ratio, selected, splits=view.splits,
            )  # fmt: skip
        out = _rope(out, cos, -sin)  # V carried rotary: turn it back by the query's position
        grouped = torch.einsum("tgi,gli->tgl", out.view(t, self.v4.o_groups, -1), self.o_a)
        return F.linear(grouped.flatten(1), self.o_b)

    def _select(
        self,
        x: torch.Tensor,
        q_res: torch.Tensor,
        step: StepTensors,
        entries: PagedKeys,
        counts: torch.Tensor,
        most: int,
        token_row: torch.Tensor,
        rot: _Rotary,
    ) -> torch.Tensor:
        """The indexer's picks [T, index_topk] (entry numbers, -1 none): every token's scores
        against its row's indexer keys, read in place from the entry pages (the channels
        after the K=V vector) up to the entries it sees, out to `most` columns; then the
        radix top-k (`kernels/indexer.py`)."""
        v4, t = self.v4, x.shape[0]
        q = F.linear(q_res, self.index_q).view(t, v4.index_heads, v4.index_head_dim)
        q = _rope(q, *rot.cos_sin(step.positions))
        weights = F.linear(x, self.index_w).float() * v4.index_heads**-0.5
        keys = entries._replace(pages=entries.pages[:, :, self.dim :])
        pos, ratio = step.positions, v4.csa_ratio
        scores = paged_indexer_scores(q.to(keys.pages.dtype), keys, weights, token_row, pos,
                                      counts, ratio, max(most, 1), fill=False)  # fmt: skip
        visible = visible_entries(token_row, pos, counts, ratio)  # the columns the top-k reads
        return indexer_topk(scores, v4.index_topk, visible)

    def _projected(self, x: torch.Tensor) -> torch.Tensor:
        """[T, values a token keeps]: the compressor's projections, then the indexer's."""
        pooler = self.pooler
        assert pooler is not None
        projected = pooler.project(x)
        if self.indexer is not None:
            projected = torch.cat((projected, self.indexer.project(x)), dim=-1)
        return projected

    def _update_decode(self, x: torch.Tensor, step: StepTensors, arena: DeepseekV4) -> None:
        """`_update` for a fixed-shape decode step (`query` token slots a row, row b's at
        b * query .., its first `q_lens[b]` real: one token, or a token and the drafts it
        verifies; padding rows of length 0): no host read, no data-dependent shape. Every
        token pools the entry it would complete, `(position + 1) // m - 1`, and the group
        writes it at the token's `entry_at` slot (-1: the token completes none, or padding:
        skipped). Every row writes its State page's whole ring, positions `total - capacity
        .. total - 1`, into `state_out` (-1: skipped) from `state_in` and its tokens
        (positions below what the lengths it must serve need get what the input ring holds
        there: unread); the ring has room for the drafts the engine may drop (`rewind`)."""
        pooler, info = self.pooler, step.info
        assert pooler is not None and isinstance(info, DecodeInfo)
        m, dev, query = pooler.ratio, x.device, info.query
        projected = self._projected(x)
        store = arena.entry_view(self.slots[1], self.slots[3])
        buffers = arena.state_view(self.slots[2], self.slots[3])
        capacity = buffers.shape[1]
        states = arena.state_rows(step, self.slots[2])
        group = step.groups[self.slots[1]]
        assert group.entry_at is not None
        total = arena.view.total_lens.long()
        q_lens = 1 if info.q_lens is None or query == 1 else info.q_lens.long()
        cached = (total - q_lens).clamp(min=0)  # the row's first token's position
        state_in = states.state_in.long().clamp(min=0)
        last = projected.shape[0] - 1

        def gather(rows: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
            """[N, L, width]: rows' projections at positions [N, L]: the ring's below the
            row's cached length, its tokens' from there (as `_update`)."""
            base = cached[rows, None]
            old = buffers[state_in[rows, None], positions.clamp(min=0) % capacity]
            here = (rows[:, None] * query + positions - base).clamp(0, last)
            new = (positions >= base)[..., None]
            return torch.where(new, projected[here], old.to(projected.dtype))

        windows = ((step.positions.long() + 1) // m - 1).clamp(min=0)
        offsets = torch.arange(pooler.span(), device=dev)
        token_rows = arena.view.token_row.long()
        tokens = gather(token_rows, (windows + 1)[:, None] * m - pooler.span() + offsets)
        store.put(group.entry_at, self._pooled(tokens, windows, arena))
        positions = total[:, None] - capacity + torch.arange(capacity, device=dev)
        rows = torch.arange(total.shape[0], device=dev)
        values = gather(rows, positions)  # all read before any write (state_in, state_out)
        page = states.state_out.long()[:, None]
        slots = torch.where(page >= 0, page * capacity + positions % capacity, -1)
        _put(buffers, slots.flatten(), values.flatten(0, 1))

    def _update(self, x: torch.Tensor, step: StepTensors, arena: DeepseekV4) -> None:
        """Pool the entries the step completes into the Compressed group and carry the
        projections entries to come need in the State group (and its checkpoints), batched
        over the rows with index tensors on the device. A row's positions read the State ring
        below its cached length (it holds [start(cached), cached)) and this step's tokens from
        there; every entry is pooled from its positions, then every kept length's ring is
        written: the row's State page (it must also serve `rewind` fewer tokens: the engine
        may drop rejected drafts) and each checkpoint's page."""
        pooler, dev = self.pooler, x.device
        assert pooler is not None and isinstance(step.info, PrefillInfo)
        m, overlap = pooler.ratio, pooler.overlap
        projected = self._projected(x)
        store = arena.entry_view(self.slots[1], self.slots[3])
        buffers = arena.state_view(self.slots[2], self.slots[3])
        capacity = buffers.shape[1]
        states = arena.state_rows(step, self.slots[2])
        group = step.groups[self.slots[1]]
        assert group.entry_indptr is not None and group.entry_slots is not None
        cached = step.info.cached_lens.long()
        first_token = step.info.query_indptr[:-1].long()
        total = arena.view.total_lens.long()
        state_in = states.state_in.long()

        def start(length: torch.Tensor) -> torch.Tensor:  # `_Pooler.start` on the device
            return (length // m - (1 if overlap else 0)).clamp(min=0) * m

        if not arena.view.decode:  # one host read: the plan's promises (a decode step's hold)
            emits = group.entry_indptr.diff().long()
            resumes = (cached > start(cached)) & (state_in < 0)
            bad = torch.stack((resumes.any(), (emits != total // m - cached // m).any()))
            missing, disagree = bad.tolist()
            if missing:
                raise ValueError("a row resumes without its compressor state")
            assert not disagree, "the plan's entry slots disagree"

        def gather(rows: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
            """[N, L, width]: rows' projections at positions [N, L]: the ring's below the
            row's cached length, this step's from there (a position before 0 reads any)."""
            base = cached[rows, None]
            old = buffers[state_in[rows, None].clamp(min=0), positions.clamp(min=0) % capacity]
            here = (first_token[rows, None] + positions - base).clamp(0, projected.shape[0] - 1)
            new = (positions >= base)[..., None]
            return torch.where(new, projected[here], old.to(projected.dtype))

        emitted = group.entry_slots.shape[0]
        if emitted:
            n = torch.arange(emitted, device=dev, dtype=group.entry_indptr.dtype)
            rows_ = torch.searchsorted(group.entry_indptr[1:], n, right=True)
            windows = cached[rows_] // m + n.long() - group.entry_indptr[rows_].long()
            offsets = torch.arange(pooler.span(), device=dev)
            tokens = gather(rows_, (windows + 1)[:, None] * m - pooler.span() + offsets)
            store[group.entry_slots] = self._pooled(tokens, windows, arena).to(store.dtype)
        # every kept length: (row, State page, length, the shortest length it must serve)
        every = torch.arange(total.shape[0], device=dev)
        ends = [(every, states.state_out.long(), total,
                 torch.maximum(total - arena.rewind, cached))]  # fmt: skip
        # checkpoints: the lists hold a padding entry past the last (page -1 here: unwritten)
        c = torch.arange(states.ckpt_page.shape[0], device=dev, dtype=states.ckpt_indptr.dtype)
        owner = torch.searchsorted(states.ckpt_indptr[1:], c, right=True)
        owner = owner.clamp(max=total.shape[0] - 1)
        length = cached[owner] + states.ckpt_len.long()
        page = torch.where(c < states.ckpt_indptr[-1], states.ckpt_page.long(), -1)
        ends.append((owner, page, length, length))
        row, page, length, shortest = (torch.cat(parts) for parts in zip(*ends, strict=True))
        positions = length[:, None] - capacity + torch.arange(capacity, device=dev)
        keep = (positions >= start(shortest)[:, None]) & (page >= 0)[:, None]
        values = gather(row, positions)[keep]  # all read before any write
        slots = page[:, None].expand_as(positions)[keep]
        buffers[slots, positions[keep] % capacity] = values.to(buffers.dtype)

    def _pooled(
        self, tokens: torch.Tensor, windows: torch.Tensor, arena: DeepseekV4
    ) -> torch.Tensor:
        pooler = self.pooler
        assert pooler is not None
        rot, split = arena.compress_rotary, pooler.projected
        pooled = pooler.pool(tokens[..., :split], windows, rot, self.eps)
        if self.indexer is None:
            return pooled
        keys = self.indexer.pool(tokens[..., split:], windows, rot, self.eps)
        return torch.cat((pooled, keys), dim=-1)


class V4Moe:
    """The layer library's MoE (`layers/moe.py`): the router kernel's `sqrt(softplus)` scores
    with the top-k of score + bias, or (hash layers) the experts the token-id table names, a
    gather in the same kernel; weights renormalised and scaled; the clamped SiLU gate
    (`silu_clamp`) fused into the expert kernels. Router weight and bias float32. Experts as
    stored: dense, FP8 (the FP8 kernels) or the published packed FP4 (its bits are MXFP4's:
    the MXFP4 kernels). The shared expert is folded into a dense or FP8 stack as an
    always-chosen expert of weight 1; beside FP4 experts (no common format) it runs as its
    own gated MLP (FP8 where stored so)."""

    def __init__(
        self, c: ModelConfig, w: WeightSource, prefix: str, hashed: bool, options: BuildOptions
    ) -> None:
        moe, v4 = c.moe, c.deepseek_v4
        assert moe is not None and v4 is not None
        p, h, e, inner = f"{prefix}mlp.", c.hidden_size, moe.num_experts, moe.intermediate_size
        self.limit = v4.swiglu_limit
        router = float32_tensor(w, f"{p}gate.weight", (e, h))

        def names(parts: tuple[str, ...]) -> list[list[str]]:
            return [[f"{p}experts.{j}.{part}.weight" for part in parts] for j in range(e)]

        gate_up = stacked_fp4_experts(w, names(("gate_proj", "up_proj")), [(inner, h)] * 2)
        shared = GatedMLP(w, f"{p}shared_experts.", h, moe.shared_intermediate_size, "silu")
        self.shared: SharedExpert | None = None
        if gate_up is not None:
            down = stacked_fp4_experts(w, names(("down_proj",)), [(h, inner)])
            if down is None:
                raise ValueError(f"{p}experts: gate / up stored as FP4, down not")
            experts = ExpertWeights(router, None, gate_up, None, down, None)
            self.shared = SharedExpert(shared, self.limit)
        else:
            experts = replace(qwen_experts(c, w, p), router=router)
            experts = experts.with_shared(shared.gate_up.weight, shared.down.weight)
        if hashed:
            experts = replace(experts, hash_table=_hash_table(c, w, f"{p}gate.tid2eid"))
        else:
            name = f"{p}gate.e_score_correction_bias"
            experts = replace(experts, score_bias=float32_tensor(w, name, (e,), "zeros"))
        self.moe = MoE(moe, experts, "silu_clamp", options.moe_gemv_max_pairs,
                       fp32_router=True, limit=self.limit)  # fmt: skip

    def __call__(self, x: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        out = self.moe(x, ids)
        if self.shared is not None:
            out = out + self.shared(x)
        return out


def _cut(moe: V4Moe, options: BuildOptions) -> V4Moe:
    """`moe`, cut for this rank as it is built where the build asks (`BuildOptions.cut_moe`)."""
    return moe if options.cut_moe is None else options.cut_moe(moe)  # type: ignore[no-any-return]


class SharedExpert:
    """The shared expert as its own gated MLP with the clamped SiLU gate (beside FP4 routed
    experts, which have no format in common with it)."""

    def __init__(self, mlp: GatedMLP, limit: float) -> None:
        self.mlp, self.limit = mlp, limit

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        act = gated_activation(self.mlp.gate_up(x), "silu_clamp", limit=self.limit)
        return self.mlp.down(act)


def _hash_table(c: ModelConfig, w: WeightSource, name: str) -> torch.Tensor:
    """A hash layer's token -> experts table, int32 [vocab, k]: the checkpoint's (every entry
    an expert id, else a clear error), or for random weights token t's experts t*k .. t*k+k-1
    modulo the expert count (distinct, all experts used)."""
    moe = c.moe
    assert moe is not None
    k, e, vocab = moe.top_k, moe.num_experts, c.vocab_size
    if isinstance(w, RandomWeights) or isinstance(getattr(w, "inner", None), RandomWeights):
        table = torch.arange(vocab * k, device=w.device).view(vocab, k) % e
        return table.to(torch.int32).contiguous()
    table = w.get(name, (vocab, k), dtype=torch.int64)
    if table.numel() and (int(table.min()) < 0 or int(table.max()) >= e):
        raise ValueError(f"{name}: expert ids must lie in [0, {e}), got "
                         f"[{int(table.min())}, {int(table.max())}]")  # fmt: skip
    return table.to(torch.int32).contiguous()


class _HyperConnection:
    def __init__(self, c: ModelConfig, w: WeightSource, prefix: str) -> None:
        v4 = c.deepseek_v4
        assert v4 is not None
        n, h, f32 = v4.hc_mult, c.hidden_size, torch.float32
        self.fn = w.get(f"{prefix}fn", ((2 + n) * n, n * h), dtype=f32)
        self.base = w.get(f"{prefix}base", ((2 + n) * n,), "zeros", dtype=f32)
        self.scale = w.get(f"{prefix}scale", (3,), "ones", dtype=f32)
        self.iterations, self.eps, self.norm_eps = v4.hc_iterations, v4.hc_eps, c.norm_eps

    def __call__(self, streams: torch.Tensor) -> tuple[torch.Tensor, ...]:
        flat = _unweighted(streams.flatten(1).float(), self.norm_eps)
        mixes = F.linear(flat, self.fn).contiguous()
        pre, post, comb = hc_weights(mixes, self.scale, self.base, self.iterations, self.eps)
        return post, comb, (pre[..., None] * streams).sum(dim=1).to(streams.dtype)


def _mix(
    streams: torch.Tensor, post: torch.Tensor, comb: torch.Tensor, out: torch.Tensor
) -> torch.Tensor:
    dtype = streams.dtype
    mixed = torch.matmul(comb.to(dtype).transpose(-1, -2), streams)
    return post.to(dtype)[..., None] * out[:, None, :] + mixed


class _Layer:
    def __init__(
        self, c: ModelConfig, w: WeightSource, p: str, attention: _Attention, moe: V4Moe
    ) -> None:
        h, f32 = c.hidden_size, torch.float32
        self.attention, self.moe, self.eps = attention, moe, c.norm_eps
        self.input_norm = w.get(f"{p}input_layernorm.weight", (h,), "ones", dtype=f32)
        self.post_norm = w.get(f"{p}post_attention_layernorm.weight", (h,), "ones", dtype=f32)
        self.attn_hc = _HyperConnection(c, w, f"{p}attn_hc.")
        self.ffn_hc = _HyperConnection(c, w, f"{p}ffn_hc.")


class _Mtp:
    """The published MTP block (`mtp.0.*`, as the reference's `V4MtpLayer`): `e_proj(enorm(
    embedding))` plus `h_proj(hnorm(stream))` per stream, a sliding-only layer (its window one
    more layer of the Window group), its own `hc_head` and `norm`; the LM head is the model's."""

    def __init__(
        self, c: ModelConfig, w: WeightSource, window_layer: int, options: BuildOptions
    ) -> None:
        v4 = c.deepseek_v4
        assert v4 is not None
        p, h, n, f32 = "mtp.0.", c.hidden_size, v4.hc_mult, torch.float32
        attention = _Attention(c, w, p, "sliding", [window_layer])
        self.layer = _Layer(c, w, p, attention, _cut(V4Moe(c, w, p, False, options), options))
        self.e_proj = w.get(f"{p}e_proj.weight", (h, h))
        self.h_proj = w.get(f"{p}h_proj.weight", (h, h))
        self.enorm = w.get(f"{p}enorm.weight", (h,), "ones", dtype=f32)
        self.hnorm = w.get(f"{p}hnorm.weight", (h,), "ones", dtype=f32)
        self.norm = w.get(f"{p}norm.weight", (h,), "ones", dtype=f32)
        self.hc_fn = w.get(f"{p}hc_head.hc_fn", (n, n * h), dtype=f32)
        self.hc_base = w.get(f"{p}hc_head.hc_base", (n,), "zeros", dtype=f32)
        self.hc_scale = w.get(f"{p}hc_head.hc_scale", (1,), "ones", dtype=f32)


class DeepseekV4(FastModel):
    # A prefill's State rings and checkpoints are `_update`'s (varlen); the fixed-shape body
    # writes each row's whole ring from its `state_in` (`_update_decode`)
    graph_prefill = False
    split_states = False

    def __init__(self, config: ModelConfig, weights: WeightSource, options: BuildOptions) -> None:
        v4 = config.deepseek_v4
        if v4 is None or config.moe is None or config.sliding_window is None:
            raise ValueError("deepseek_v4 needs its DeepseekV4Config, MoE and window")
        super().__init__(config, weights, options)
        self.v4 = v4
        self.rewind = options.max_draft_tokens  # State room for drafts a step may drop
        kinds = [k for k in ("csa", "hca") if k in v4.attention]
        self.kinds = kinds
        self.counts = {k: v4.attention.count(k) for k in kinds}
        self.layers = []
        seen = dict.fromkeys(kinds, 0)
        self._widths: dict[str, tuple[int, int, int]] = {}  # entry width, buffer tokens, width
        for i, kind in enumerate(v4.attention):
            slots = [i]
            if kind != "sliding":
                k = kinds.index(kind)
                slots += [1 + k, 1 + len(kinds) + k, seen[kind]]
                seen[kind] += 1
            prefix = f"model.layers.{i}."
            attention = _Attention(config, weights, prefix, kind, slots)
            if attention.pooler is not None:
                extra = attention.indexer.projected if attention.indexer is not None else 0
                entry = config.head_dim + (v4.index_head_dim if kind == "csa" else 0)
                buffer = attention.pooler.buffer_tokens() + self.rewind
                self._widths[kind] = (entry, buffer, attention.pooler.projected + extra)
            moe = _cut(V4Moe(config, weights, prefix, v4.hash_layers[i], options), options)
            self.layers.append(_Layer(config, weights, prefix, attention, moe))
        f32, h, n = torch.float32, config.hidden_size, v4.hc_mult
        self.norm_weight = weights.get("model.norm.weight", (h,), "ones", dtype=f32)
        self.hc_fn = weights.get("model.hc_head.hc_fn", (n, n * h), dtype=f32)
        self.hc_base = weights.get("model.hc_head.hc_base", (n,), "zeros", dtype=f32)
        self.hc_scale = weights.get("model.hc_head.hc_scale", (1,), "ones", dtype=f32)
        self.main_rotary = _Rotary(config.rope, v4.rope_dim, self.device)
        self.compress_rotary = _Rotary(v4.compress_rope, v4.rope_dim, self.device)
        self.mtp: _Mtp | None = None
        self.window_layers = config.num_layers
        if options.mtp:
            if not config.num_mtp_layers:
                raise ValueError(f"{config.model_type}: the checkpoint has no MTP layers")
            self.mtp = _Mtp(config, weights, config.num_layers, options)
            self.window_layers += 1  # its window: one more layer of the Window group
        self._streams: torch.Tensor | None = None
        # a fixed-shape decode step's final streams by (tokens, query slots): a captured MTP pass
        # reads the ones its own shape's decode graph wrote
        self._decode_streams: dict[tuple[int, int], torch.Tensor] = {}
        # a decode step's bound on a row's length: the context limit (no host read of lengths)
        self.longest = min(options.max_positions, config.max_positions) + 1
        self.layers_per_group = (1,)
        self.page_size = 0  # set by `cache_groups`
        self._kv: torch.Tensor | None = None
        self._region = torch.zeros(0, 0, dtype=torch.uint8)  # the step's State region
        self._view: _StepView | None = None
        self._num_sms = (
            torch.cuda.get_device_properties(self.device).multi_processor_count
            if self.device.type == "cuda"
            else 0
        )

    # ----- cache groups and views ---------------------------------------------------------

    def _entries_per_page(self, ratio: int) -> int:
        return Compressed(ratio).entries_per_page(self.page_size)

    def cache_groups(self, page_size: int) -> tuple[CacheGroupSpec, ...]:
        """The reference runner's groups, byte for byte (module docstring)."""
        self.page_size = page_size
        size, v4 = self.dtype.itemsize, self.v4
        layers, d = self.window_layers, self.config.head_dim
        groups: list[CacheGroupSpec] = [Window(int(self.config.sliding_window or 0),
                                               layers * page_size * d * size)]  # fmt: skip
        for kind in self.kinds:
            ratio = v4.csa_ratio if kind == "csa" else v4.hca_ratio
            entry = self._widths[kind][0]
            per_page = self._entries_per_page(ratio)
            groups.append(Compressed(ratio, self.counts[kind] * per_page * entry * size))
        for kind in self.kinds:
            _, tokens, width = self._widths[kind]
            groups.append(State(self.counts[kind] * tokens * width * size, self.rewind))
        return tuple(groups)

    def state_bytes(self) -> int:
        groups = self.cache_groups(self.page_size or 16)
        return max(g.bytes_per_page for g in groups if g.state_region)

    def cache_token_shape(self) -> tuple[int, int, int]:
        """The token arena as one flat vector a page (a one-layer group of one plane)."""
        token = max(g.bytes_per_page for g in self.cache_groups(self.page_size or 16)
                    if not g.state_region)  # fmt: skip
        per_token = -(-token // (self.dtype.itemsize * (self.page_size or 16)))
        return 1, 1, per_token

    @property
    def view(self) -> _StepView:
        assert self._view is not None, "a step's view is set by `_begin`"
        return self._view

    def _flat(self) -> torch.Tensor:
        assert self._kv is not None
        return self._kv.view(self._kv.shape[0], -1)

    def window_view(self, layer: int) -> _Slots:
        """Layer `layer`'s K=V vectors by arena token slot (page * page_size + offset)."""
        n, ps, d = self.window_layers, self.page_size, self.config.head_dim
        pages = self._flat()[:, : n * ps * d].view(-1, n, ps, d)
        return _Slots(pages[:, layer])

    def entry_view(self, group: int, index: int) -> _Slots:
        """Layer `index` of Compressed group `group` by arena entry slot (page * E + w % E)."""
        kind = self.kinds[group - 1]
        ratio = self.v4.csa_ratio if kind == "csa" else self.v4.hca_ratio
        per_page, width = self._entries_per_page(ratio), self._widths[kind][0]
        count = self.counts[kind]
        pages = self._flat()[:, : count * per_page * width].view(-1, count, per_page, width)
        return _Slots(pages[:, index])

    def state_view(self, group: int, index: int) -> torch.Tensor:
        """Layer `index` of State group `group`: [state pages, tokens, width] (a ring)."""
        kind = self.kinds[group - 1 - len(self.kinds)]
        _, tokens, width = self._widths[kind]
        count = self.counts[kind]
        region = self._region
        flat = region[:, : count * tokens * width * self.dtype.itemsize].view(self.dtype)
        return flat.view(region.shape[0], count, tokens, width)[:, index]

    def state_rows(self, step: StepTensors, group: int) -> StateRows:
        return step.states[group - 1 - len(self.kinds)]

    # ----- forward ------------------------------------------------------------------------

    def _begin(self, step: StepTensors, kv: torch.Tensor) -> None:
        """The step's arena, State region and `_StepView` (a `DecodeInfo` step's from its
        fixed-shape tensors alone: no host read)."""
        info = step.info
        self._kv = kv
        if step.states:
            self._region = step.states[0].region
        t = step.input_ids.shape[0]
        tokens = torch.arange(t, device=self.device, dtype=torch.int32)
        blocks = -(-self.config.num_heads // 16)
        splits = default_splits(t, blocks, self._num_sms) if self._num_sms else 1
        if isinstance(info, DecodeInfo):  # token t of row t // query (verify rows: query > 1)
            rows = tokens // info.query if info.query > 1 else tokens
            self._view = _StepView(rows, info.seq_lens, self.longest, splits, True, True)
            return
        token_row = torch.searchsorted(info.query_indptr[1:], tokens, right=True).int()
        total_lens = (info.cached_lens + info.query_indptr.diff()).int()
        indptr, cached = info.query_indptr.tolist(), info.cached_lens.tolist()
        totals = [c + hi - lo for lo, hi, c in zip(indptr[:-1], indptr[1:], cached, strict=True)]
        most = max(totals, default=0)
        self._view = _StepView(token_row, total_lens, most, splits, len(totals) == t)

    def mtp_forward(
        self, ids: torch.Tensor, previous: torch.Tensor, step: StepTensors, kv: torch.Tensor
    ) -> torch.Tensor:
        """The MTP layer on (token `ids[t]`, the main model's final streams at t from this
        step's `forward`; `previous`, its collapsed output, is not what V4 pairs with) at the
        step's positions, writing its window layer at the append slots: [T, hidden] whose
        `logits` are drafts one past the main model's tokens."""
        mtp, streams = self.mtp, self._streams
        if mtp is None:
            raise RuntimeError("the model was built without its MTP layer (BuildOptions.mtp)")
        if isinstance(step.info, DecodeInfo):  # the decode graph's of the same shape
            streams = self._decode_streams.get((ids.shape[0], step.info.query))
        assert streams is not None and streams.shape[0] == previous.shape[0]
        self._begin(step, kv)
        eps = self.config.norm_eps
        embeds = _norm(self.embed_tokens(ids), mtp.enorm, eps)
        x = F.linear(embeds, mtp.e_proj)[:, None, :] + F.linear(
            _norm(streams, mtp.hnorm, eps), mtp.h_proj
        )
        x = self._layer(mtp.layer, "sliding", x, step, ids)
        flat = _unweighted(x.flatten(1).float(), eps)
        pre = hc_head_weights(F.linear(flat, mtp.hc_fn).contiguous(), mtp.hc_scale,
                              mtp.hc_base, self.v4.hc_eps)  # fmt: skip
        return _norm((pre[..., None] * x).sum(dim=1).to(x.dtype), mtp.norm, eps)

    def _layer(
        self,
        layer: _Layer,
        kind: str,
        streams: torch.Tensor,
        step: StepTensors,
        ids: torch.Tensor,
    ) -> torch.Tensor:
        rot = self.main_rotary if kind == "sliding" else self.compress_rotary
        post, comb, collapsed = layer.attn_hc(streams)
        x = _norm(collapsed, layer.input_norm, layer.eps)
        streams = _mix(streams, post, comb, layer.attention(x, step, self, rot))
        post, comb, collapsed = layer.ffn_hc(streams)
        x = _norm(collapsed, layer.post_norm, layer.eps)
        return _mix(streams, post, comb, layer.moe(x, ids))

    def forward(self, step: StepTensors, kv: torch.Tensor) -> torch.Tensor:
        self._begin(step, kv)
        x = self.embed_tokens(step.input_ids)
        streams = x[:, None, :].expand(-1, self.v4.hc_mult, -1).contiguous()
        for layer, kind in zip(self.layers, self.v4.attention, strict=True):
            streams = self._layer(layer, kind, streams, step, step.input_ids)
        self._streams = streams if self.mtp is not None else None
        if self.mtp is not None and isinstance(step.info, DecodeInfo):
            # keyed by (tokens, query slots): (2 rows, 1) and (1 row, 2 slots) are two graphs
            self._decode_streams[(streams.shape[0], step.info.query)] = streams
        flat = _unweighted(streams.flatten(1).float(), self.config.norm_eps)
        mixes = F.linear(flat, self.hc_fn).contiguous()
        pre = hc_head_weights(mixes, self.hc_scale, self.hc_base, self.v4.hc_eps)
        collapsed = (pre[..., None] * streams).sum(dim=1).to(streams.dtype)
        return _norm(collapsed, self.norm_weight, self.config.norm_eps)
