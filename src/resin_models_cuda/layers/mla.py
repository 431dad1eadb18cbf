"""DeepSeek multi-head latent attention as a layer, over the paged latent cache (one
`[kv_lora_rank + rope_dim]` vector per token per layer, `kernels/mla.py`).

- Projections: q (direct, or `q_a` -> norm -> `q_b`) and `kv_a_proj_with_mqa` -> latent
  (normed in place) and the shared rotary key, the two that read the layer input in one
  matmul; both rotated by the half-split rope kernel in place. Interleaved
  checkpoints (V2, V3's `rope_interleave`) get their rotary rows de-interleaved once at load,
  which turns pair-wise rotation into the half-split one with every score unchanged.
- Decode (graph-safe): absorbed. `q_nope` is multiplied into latent space by `W_uk` (from
  `kv_b_proj`), `mla_decode` attends over the latents, and `W_uv` maps the latent output back
  to per-head values before `o_proj`. Nothing per-head is ever cached or expanded.
- Prefill (eager): the row's cached + new latents are expanded to per-head K/V with
  `kv_b_proj` and attended causally (PyTorch SDPA: values padded to the query width so its
  flash kernel applies), row by row; the row bounds are read to the host once per step
  (`prefill_rows`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from resin_model.config import ModelConfig
from resin_models_cuda.kernels.mla import latent_append, mla_decode
from resin_models_cuda.layers.norm import RMSNorm
from resin_models_cuda.layers.rotary import Rotary
from resin_models_cuda.layers.weights import WeightSource
from resin_models_cuda.step import DecodeInfo, GroupTensors, LayerSlot, PrefillInfo, StepTensors

LATENT_NORM_EPS = 1e-6  # DeepSeek's q_a / kv_a norms use the RMSNorm default


def _deinterleave(weight: torch.Tensor, start: int, rope: int, period: int) -> torch.Tensor:
    """Reorder the rotary rows [x0, x1, x2, ...] -> [x0, x2, ... | x1, x3, ...] in every
    `period`-row block (one per head) starting at row `start`."""
    rows = torch.arange(weight.shape[0], device=weight.device).view(-1, period)
    block = rows[:, start : start + rope]
    rows[:, start : start + rope] = torch.cat((block[:, 0::2], block[:, 1::2]), dim=1)
    return weight[rows.flatten()].contiguous()


class MlaAttention:
    """`prefix` is the layer's `...self_attn.`."""

    def __init__(
        self, config: ModelConfig, w: WeightSource, prefix: str, slot: LayerSlot, rotary: Rotary
    ) -> None:
        mla = config.mla
        assert mla is not None
        self.mla, self.slot, self.rotary, self.scale = mla, slot, rotary, config.scale
        h, heads = config.hidden_size, config.num_heads
        self.heads, self.qk = heads, mla.nope_dim + mla.rope_dim
        q_a: torch.Tensor | None = None
        self.q_a_norm: RMSNorm | None = None
        if mla.q_lora_rank is None:
            q = w.get(f"{prefix}q_proj.weight", (heads * self.qk, h))
        else:
            rank = mla.q_lora_rank
            q_a = w.get(f"{prefix}q_a_proj.weight", (rank, h))
            self.q_a_norm = RMSNorm(w, f"{prefix}q_a_layernorm.weight", rank, LATENT_NORM_EPS)
            q = w.get(f"{prefix}q_b_proj.weight", (heads * self.qk, rank))
        kv_a = w.get(f"{prefix}kv_a_proj_with_mqa.weight", (mla.latent_dim, h))
        if mla.rope_interleave:
            q = _deinterleave(q, mla.nope_dim, mla.rope_dim, self.qk)
            kv_a = _deinterleave(kv_a, mla.kv_lora_rank, mla.rope_dim, mla.latent_dim)
        # Everything that reads the layer input in one matmul: [q (or q_a) ; kv_a].
        first = q if q_a is None else q_a
        self.q_size, self.in_proj = first.shape[0], torch.cat((first, kv_a))
        self.q_b = None if q_a is None else q
        self.kv_a_norm = RMSNorm(
            w, f"{prefix}kv_a_layernorm.weight", mla.kv_lora_rank, LATENT_NORM_EPS
        )
        kv_b = w.get(
            f"{prefix}kv_b_proj.weight",
            (heads * (mla.nope_dim + mla.v_head_dim), mla.kv_lora_rank),
        )
        self.kv_b = kv_b
        per_head = kv_b.view(heads, mla.nope_dim + mla.v_head_dim, mla.kv_lora_rank)
        self.w_uk = per_head[:, : mla.nope_dim].contiguous()  # [H, nope, C]
        self.w_uv_t = per_head[:, mla.nope_dim :].transpose(1, 2).contiguous()  # [H, C, v]
        self.o_proj = w.get(f"{prefix}o_proj.weight", (h, heads * mla.v_head_dim), "out")

    def __call__(
        self, x: torch.Tensor, step: StepTensors, kv: torch.Tensor, rows: PrefillRows | None
    ) -> torch.Tensor:
        """`rows`: the prefill step's row bounds on the host (None for decode steps)."""
        mla, t, c = self.mla, x.shape[0], self.mla.kv_lora_rank
        projected = F.linear(x, self.in_proj)
        q_in, entry = projected[:, : self.q_size], projected[:, self.q_size :]  # [T, C + R]
        if self.q_b is not None:
            assert self.q_a_norm is not None
            q_in = F.linear(self.q_a_norm(q_in), self.q_b)
        q = q_in.view(t, self.heads, self.qk)
        self.kv_a_norm(entry[:, :c], out=entry[:, :c])  # in place, strided rows
        q_rope = q[:, :, mla.nope_dim :]
        self.rotary(q_rope, entry[:, None, c:], step.positions)
        group = step.groups[self.slot.group]
        cache = kv[:, self.slot.index, 0]  # [pages, page_size, 1, C + R]
        latent_append(entry, cache, group.slots)
        info = step.info
        if isinstance(info, DecodeInfo):
            assert rows is None
            # Head-major batched products: [H, T, nope] @ [H, nope, C], then the latent
            # output [H, T, C] @ [H, C, v]; the attention reads and writes those layouts.
            absorbed = torch.bmm(q[:, :, : mla.nope_dim].transpose(0, 1), self.w_uk)
            out_latent = torch.empty((self.heads, t, c), dtype=x.dtype, device=x.device)
            indptr, start, lens = per_query(info, group.page_indptr, group.page_start)
            mla_decode(
                absorbed.transpose(0, 1),
                q_rope,
                cache,
                indptr,
                group.page_ids,
                start,
                lens,
                scale=self.scale,
                splits=info.splits,
                out=out_latent.transpose(0, 1),
            )
            out = torch.bmm(out_latent, self.w_uv_t).transpose(0, 1)  # [T, H, v]
        else:
            assert rows is not None
            out = self._prefill(q, cache, group, rows)
        return F.linear(out.reshape(t, -1), self.o_proj)

    def _prefill(
        self, q: torch.Tensor, cache: torch.Tensor, group: GroupTensors, rows: PrefillRows
    ) -> torch.Tensor:
        """Expanded causal attention row by row. SDPA falls back to its math backend (float32
        scores of the whole square: 235 of 275 ms in a 4k prefill on the H200) for 3-D inputs
        or unequal q / v head dims, so inputs are 4-D, values zero-padded to the query width,
        and a row with nothing cached before it is plain causal; other rows take an additive
        mask."""
        mla, page = self.mla, cache.shape[1]
        out = torch.empty((q.shape[0], self.heads, mla.v_head_dim), dtype=q.dtype, device=q.device)
        for b in range(len(rows.bounds) - 1):
            q0, q1 = rows.bounds[b], rows.bounds[b + 1]
            first, total = rows.starts[b] * page, rows.cached[b] + q1 - q0
            pos = torch.arange(first, total, device=q.device)
            pages = group.page_ids[rows.indptr[b] + pos // page - rows.starts[b]].long()
            entries = cache[pages, pos % page, 0].to(q.dtype)  # [K, C + R]
            kv = F.linear(entries[:, : mla.kv_lora_rank], self.kv_b)
            kv = kv.view(-1, self.heads, mla.nope_dim + mla.v_head_dim).transpose(0, 1)
            rope = entries[None, :, mla.kv_lora_rank :].expand(self.heads, -1, -1)
            keys = torch.cat((kv[..., : mla.nope_dim], rope), dim=-1)  # [H, K, qk]
            values = kv[..., mla.nope_dim :]
            if values.shape[-1] < self.qk:  # equal head dims: the flash kernel, not math
                values = F.pad(values, (0, self.qk - values.shape[-1]))
            # 4-D [1, H, T, D]: SDPA's fused kernels take no 3-D inputs.
            q_row, keys, values = q[q0:q1].transpose(0, 1)[None], keys[None], values[None]
            if first == 0 and rows.cached[b] == 0:  # keys == queries: plain causal
                o = F.scaled_dot_product_attention(
                    q_row, keys, values, is_causal=True, scale=self.scale
                )
            else:  # queries at the end of the keys: an additive mask in the query dtype
                q_pos = torch.arange(rows.cached[b], total, device=q.device)
                mask = torch.zeros((q1 - q0, pos.shape[0]), dtype=q.dtype, device=q.device)
                mask.masked_fill_(pos[None, :] > q_pos[:, None], float("-inf"))
                o = F.scaled_dot_product_attention(q_row, keys, values, mask, scale=self.scale)
            o = o[0, ..., : mla.v_head_dim]
            out[q0:q1] = o.transpose(0, 1)
        return out


def per_query(
    info: DecodeInfo, page_indptr: torch.Tensor, page_start: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The absorbed decode kernel's per-row page-row starts, first page indices and lengths,
    for every query token: a verify step's row b holds `query` slots, the last `q_lens[b]`
    real ones at its last positions, so slot j sees the keys up to its own position (causal
    among the drafts; padding slots repeat the last real one, as `decode_attention` does).
    One query per row: the tensors as they are. Fixed shapes, CUDA-graph safe."""
    if info.query == 1:
        return page_indptr, page_start, info.seq_lens
    assert info.q_lens is not None
    q = info.query
    n = info.q_lens.clamp(min=1)[:, None]
    j = torch.arange(q, dtype=torch.int32, device=n.device)[None, :]
    lens = info.seq_lens[:, None] - n + torch.minimum(j, n - 1) + 1
    lens = torch.where(info.seq_lens[:, None] > 0, lens, 0).to(torch.int32).flatten()
    starts = page_indptr[:-1].repeat_interleave(q)
    indptr = torch.cat((starts, page_indptr[-1:]))  # the kernel reads row starts only
    return indptr, page_start.repeat_interleave(q), lens


@dataclass(frozen=True, slots=True)
class PrefillRows:
    """A prefill step's row bounds, read to the host once per step (not once per layer)."""

    bounds: list[int]  # query_indptr
    cached: list[int]
    starts: list[int]  # page_start
    indptr: list[int]  # page_indptr


def prefill_rows(step: StepTensors) -> PrefillRows | None:
    """None for a decode step (graph-safe: nothing is read back)."""
    info = step.info
    if not isinstance(info, PrefillInfo):
        return None
    group = step.groups[0]  # a DeepSeek model has one cache group
    return PrefillRows(
        info.query_indptr.tolist(),
        info.cached_lens.tolist(),
        group.page_start.tolist(),
        group.page_indptr.tolist(),
    )
