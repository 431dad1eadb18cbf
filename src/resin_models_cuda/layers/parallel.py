"""The fast layers cut for tensor and expert parallelism (`resin_models_cuda.parallel` applies
them to a built model). Each rank keeps a slice of a built layer's weights, in the layer's own
format (dense, FP8 with its scales, MXFP4), and the layers whose slices produce partial sums
end in one all-reduce over the model group.

- `column_parallel`: a fused projection (`[q; k; v]`, `[gate; up]`) keeps, of each part, the
  rank's contiguous run of rows; no collective.
- `RowParallelLinear`: the rank's run of input columns, then one all-reduce; the bias is added
  on rank 0 only, so the sum holds it once.
- `RowParallelMla`: multi-head latent attention with the rank's heads (q / `kv_b` rows,
  absorbed `W_uk` / `W_uv`, `o_proj` columns), then one all-reduce. The latent cache is
  per token, not per head, so every rank caches the same latents.
- `ParallelMoE`: the router is replicated (every rank routes every token the same way), then
  either every expert is split like a dense MLP (`split_experts`) or each rank keeps a
  contiguous run of whole experts (`ExpertRun`, expert parallel); one all-reduce combines.

Expert parallelism here dispatches with no communication: after the attention all-reduce
every rank holds every token's hidden state, so dispatch is a local relabelling of the routed
(token, expert) pairs (an expert of this rank -> its local index; any other expert -> local
expert 0 with weight 0, so the kernels' fixed, graph-safe shapes stay as they are) and
combine is the all-reduce of the ranks' partial [T, H] sums. Each rank reads only its experts'
weights (what decode is bound by); a pair of another rank still costs its arithmetic on local
expert 0. Shared experts (DeepSeek's, folded into the stack as always-chosen experts) live on
rank 0 only.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

import torch
import torch.distributed as dist

from resin_models_cuda.kernels.moe_fp8 import Fp8Experts
from resin_models_cuda.kernels.moe_mxfp4 import Mxfp4Experts
from resin_models_cuda.layers.mla import MlaAttention, PrefillRows
from resin_models_cuda.layers.moe import Experts, ExpertWeights, MoE
from resin_models_cuda.layers.quantized import (
    Fp8Weight,
    Linear,
    cat_fp8,
    slice_fp8,
    stack_fp8,
    unstack_fp8,
)
from resin_models_cuda.step import StepTensors

Group = dist.ProcessGroup | None
Matrix = torch.Tensor | Fp8Weight


@dataclass(frozen=True, slots=True)
class Shard:
    """Rank `rank` of `size` in `group` (the model group of one replica)."""

    rank: int
    size: int
    group: Group

    def run(self, total: int) -> tuple[int, int]:
        """(start, length) of this rank's equal share of `total` (which `size` divides)."""
        if total % self.size:
            raise ValueError(f"{total} does not split evenly over {self.size} ranks")
        part = total // self.size
        return self.rank * part, part


def own(t: torch.Tensor) -> torch.Tensor:
    """A contiguous copy: a slice that stayed a view would keep the whole built tensor alive."""
    return t.clone(memory_format=torch.contiguous_format)


def _narrow(w: Matrix, axis: int, start: int, length: int) -> Matrix:
    if isinstance(w, Fp8Weight):
        cut = slice_fp8(w, axis, start, length)
        return Fp8Weight(own(cut.w), own(cut.scale), cut.block)
    return own(w.narrow(axis, start, length))


def _cat(parts: list[Matrix]) -> Matrix:
    if all(isinstance(p, Fp8Weight) for p in parts):
        return cat_fp8([p for p in parts if isinstance(p, Fp8Weight)])
    return torch.cat([p for p in parts if isinstance(p, torch.Tensor)]).contiguous()


def column_parallel(linear: Linear, parts: list[int], shard: Shard) -> Linear:
    """`linear`, whose output rows are the fused `parts` (row counts), with this rank's run of
    rows of every part (and of the bias)."""
    weights: list[Matrix] = []
    biases: list[torch.Tensor] = []
    offset = 0
    for rows in parts:
        start, length = shard.run(rows)
        weights.append(_narrow(linear.weight, 0, offset + start, length))
        if linear.bias is not None:
            biases.append(linear.bias.narrow(0, offset + start, length))
        offset += rows
    return Linear(_cat(weights), torch.cat(biases).contiguous() if biases else None)


class RowParallelLinear(Linear):
    """This rank's run of `linear`'s input columns; the partial products are summed by one
    all-reduce (the bias added on rank 0 only)."""

    def __init__(self, linear: Linear, shard: Shard) -> None:
        w = linear.weight
        columns = int(w.w.shape[1] if isinstance(w, Fp8Weight) else w.shape[1])
        start, length = shard.run(columns)
        super().__init__(_narrow(w, 1, start, length), linear.bias if shard.rank == 0 else None)
        self.group = shard.group

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        y = super().__call__(x)
        dist.all_reduce(y, group=self.group)
        return y


class RowParallelMla(MlaAttention):
    """`MlaAttention` over this rank's heads (the built layer's tensors, sliced), its output
    projection's partial sums added by one all-reduce."""

    def __init__(self, built: MlaAttention, shard: Shard) -> None:
        vars(self).update(vars(built))  # adopt the built layer, then cut it
        mla = built.mla
        first, heads = shard.run(built.heads)
        self.heads, self.group = heads, shard.group
        per_q = built.qk
        if built.q_b is None:  # `in_proj` is [q ; kv_a]: keep this rank's q rows
            q = built.in_proj[: built.q_size].narrow(0, first * per_q, heads * per_q)
            self.in_proj = torch.cat((q, built.in_proj[built.q_size :]))
            self.q_size = heads * per_q
        else:  # `in_proj` is [q_a ; kv_a], shared by every head
            self.q_b = own(built.q_b.narrow(0, first * per_q, heads * per_q))
        per_kv = mla.nope_dim + mla.v_head_dim
        self.kv_b = own(built.kv_b.narrow(0, first * per_kv, heads * per_kv))
        self.w_uk = own(built.w_uk.narrow(0, first, heads))
        self.w_uv_t = own(built.w_uv_t.narrow(0, first, heads))
        v = mla.v_head_dim
        self.o_proj = own(built.o_proj.narrow(1, first * v, heads * v))

    def __call__(
        self, x: torch.Tensor, step: StepTensors, kv: torch.Tensor, rows: PrefillRows | None
    ) -> torch.Tensor:
        out = super().__call__(x, step, kv, rows)
        dist.all_reduce(out, group=self.group)
        return out


def _experts_rows(w: Experts, halves: int, shard: Shard) -> Experts:
    """Of every expert's output rows (`halves` equal parts: 2 for [gate; up]), this rank's run
    of each part."""
    if isinstance(w, Fp8Experts):
        rows = int(w.w.shape[1])
        return stack_fp8([_fp8_rows(part, rows, halves, shard) for part in unstack_fp8(w)])
    tensors = (w.blocks, w.scales) if isinstance(w, Mxfp4Experts) else (w,)
    cut = []
    for t in tensors:
        part = t.shape[1] // halves
        start, length = shard.run(part)
        cut.append(torch.cat([t.narrow(1, h * part + start, length) for h in range(halves)], 1))
    if isinstance(w, Mxfp4Experts):
        return Mxfp4Experts(cut[0].contiguous(), cut[1].contiguous())
    return cut[0].contiguous()


def _fp8_rows(w: Fp8Weight, rows: int, halves: int, shard: Shard) -> Fp8Weight:
    part = rows // halves
    start, length = shard.run(part)
    return cat_fp8([slice_fp8(w, 0, h * part + start, length) for h in range(halves)])


def _experts_columns(w: Experts, shard: Shard) -> Experts:
    """This rank's run of every expert's input columns (MXFP4: whole 32-column groups)."""
    if isinstance(w, Fp8Experts):
        columns = int(w.w.shape[2])
        start, length = shard.run(columns)
        return stack_fp8([slice_fp8(p, 1, start, length) for p in unstack_fp8(w)])
    if isinstance(w, Mxfp4Experts):
        start, length = shard.run(w.scales.shape[2])  # groups of 32 columns
        blocks = own(w.blocks.narrow(2, start, length))
        return Mxfp4Experts(blocks, own(w.scales.narrow(2, start, length)))
    start, length = shard.run(w.shape[2])
    return own(w.narrow(2, start, length))


def split_experts(w: ExpertWeights, shard: Shard) -> ExpertWeights:
    """Every expert (shared ones too) split like a dense gated MLP: gate / up rows and down
    columns of this rank's run of the expert width; the down bias on rank 0 only."""
    bias = w.gate_up_bias
    if bias is not None:
        part = bias.shape[1] // 2
        start, length = shard.run(part)
        bias = torch.cat((bias.narrow(1, start, length), bias.narrow(1, part + start, length)), 1)
    return replace(
        w,
        gate_up=_experts_rows(w.gate_up, 2, shard),
        gate_up_bias=None if bias is None else bias.contiguous(),
        down=_experts_columns(w.down, shard),
        down_bias=w.down_bias if shard.rank == 0 else None,
    )


def _take(w: Experts, index: torch.Tensor) -> Experts:
    if isinstance(w, Fp8Experts):
        return Fp8Experts(w.w[index].contiguous(), w.scale[index].contiguous(), w.block)
    if isinstance(w, Mxfp4Experts):
        return Mxfp4Experts(w.blocks[index].contiguous(), w.scales[index].contiguous())
    return w[index].contiguous()


@dataclass(frozen=True, slots=True)
class ExpertRun:
    """Expert parallelism: this rank's contiguous run `[first, first + count)` of the routed
    experts (nearly equal runs: rank r holds `[E r / size, E (r+1) / size)`)."""

    first: int
    count: int

    @classmethod
    def of(cls, experts: int, shard: Shard) -> ExpertRun:
        if experts < shard.size:
            raise ValueError(f"{experts} experts do not spread over {shard.size} ranks")
        first = experts * shard.rank // shard.size
        return cls(first, experts * (shard.rank + 1) // shard.size - first)

    def weights(self, w: ExpertWeights, experts: int, shard: Shard) -> ExpertWeights:
        """The stacks of this rank's experts, then (rank 0 only) the shared ones."""
        shared = w.shared if shard.rank == 0 else 0
        keep = [*range(self.first, self.first + self.count), *range(experts, experts + shared)]
        index = torch.tensor(keep, dtype=torch.long, device=w.router.device)

        def bias(b: torch.Tensor | None) -> torch.Tensor | None:
            return None if b is None else b[index].contiguous()

        return replace(
            w,
            gate_up=_take(w.gate_up, index),
            gate_up_bias=bias(w.gate_up_bias),
            down=_take(w.down, index),
            down_bias=bias(w.down_bias),
            shared=shared,
        )


class ParallelMoE(MoE):
    """A MoE layer whose experts are split (`run` None: every expert cut by `split_experts`)
    or spread (`run`: this rank's whole experts); the partial sums meet in one all-reduce.
    `extra`: a term of the layer's output outside the stack (DeepSeek-V4's shared expert
    beside FP4 experts) that this rank adds before the sum; give it to one rank only."""

    def __init__(
        self,
        built: MoE,
        shard: Shard,
        expert_parallel: bool,
        extra: Callable[[torch.Tensor], torch.Tensor] | None = None,
    ) -> None:
        experts = built.moe.num_experts
        self.run = ExpertRun.of(experts, shard) if expert_parallel else None
        if self.run is None:
            local = split_experts(built.w, shard)
        else:
            local = self.run.weights(built.w, experts, shard)
        super().__init__(built.moe, local, built.act, built.gemv_max_pairs, limit=built.limit)
        self.router = built.router  # as built (float32 where the model routes in float32)
        self.group, self.extra = shard.group, extra

    def route(
        self, x: torch.Tensor, ids: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The full routing, then (expert parallel) each pair relabelled to this rank's stack:
        its own experts to local indices, shared ones after them, the rest to local expert 0
        at weight 0 (see the module docstring)."""
        weight, expert = super().route(x, ids)
        run = self.run
        if run is None:
            return weight, expert
        routed = self.moe.num_experts
        shared = expert >= routed  # only on rank 0, which holds the shared experts
        mine = shared | ((expert >= run.first) & (expert < run.first + run.count))
        local = torch.where(shared, expert - routed + run.count, expert - run.first)
        local = torch.where(mine, local, torch.zeros_like(local))
        return torch.where(mine, weight, torch.zeros_like(weight)), local.to(torch.int32)

    def __call__(self, x: torch.Tensor, ids: torch.Tensor | None = None) -> torch.Tensor:
        out = super().__call__(x, ids)
        if self.extra is not None:
            out = out + self.extra(x)
        dist.all_reduce(out, group=self.group)
        return out
