"""The cut layers of `resin_models_cuda.layers.parallel`, in one process: in a group of one
rank the all-reduce is the identity, so a layer cut as rank r of 2 returns rank r's part, and
the two parts together must give the uncut layer's output. Dense, FP8 (128 x 128 blocks and
per channel) and MXFP4 weights; experts split (TP) and spread (EP, shared experts on rank 0),
on both MoE paths; DeepSeek-V4's MoE layers (hash routing, the shared expert beside FP4
experts). On CPU the kernels run in Triton's interpreter."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace

import pytest
import torch
import torch.distributed as dist

from resin_model.config import MoeConfig
from resin_models_cuda.kernels.moe_fp8 import Fp8Experts
from resin_models_cuda.kernels.moe_mxfp4 import Mxfp4Experts
from resin_models_cuda.layers import ExpertWeights, MoE, RandomWeights
from resin_models_cuda.layers.parallel import (
    ParallelMoE,
    RowParallelLinear,
    Shard,
    column_parallel,
)
from resin_models_cuda.layers.quantized import QuantizingWeights, linear, stacked_experts

H = 128


@pytest.fixture(scope="module")
def group() -> Iterator[dist.ProcessGroup]:
    """A Gloo group of this process alone (the default group of a one-rank world)."""
    assert not dist.is_initialized()
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        yield dist.group.WORLD  # type: ignore[misc]
    finally:
        dist.destroy_process_group()


def _source(device: str, fmt: str) -> RandomWeights | QuantizingWeights:
    plain = RandomWeights(device, torch.float32, seed=3, std=0.3)
    return plain if fmt == "dense" else QuantizingWeights(plain, fmt)  # type: ignore[arg-type]


@pytest.mark.parametrize("fmt", ["dense", "fp8-block", "fp8-channel"])
@pytest.mark.parametrize("rows", [3, 20])  # FP8: the GEMV, then the tile GEMM
def test_projections_cut_by_rows_and_by_columns(
    device: str, group: dist.ProcessGroup, fmt: str, rows: int
) -> None:
    w = _source(device, fmt)
    parts = [64, 32, 32]  # [q; k; v] of 4 + 2 + 2 heads of 16
    bias = w.get("qkv.bias", (sum(parts),))
    qkv = linear(w, ["q", "k", "v"], [(p, H) for p in parts], bias=bias)
    o_proj = linear(w, ["o"], [(H, 64)], "out", w.get("o.bias", (H,)))
    x = torch.randn(rows, H, device=device)
    whole = qkv(x)
    q, k, v = whole.split(parts, dim=1)
    shards = [Shard(r, 2, group) for r in (0, 1)]
    for r, shard in enumerate(shards):  # rank r: the r-th half of each of q, k and v
        expect = torch.cat([t.chunk(2, dim=1)[r] for t in (q, k, v)], dim=1)
        got = column_parallel(qkv, parts, shard)(x)
        torch.testing.assert_close(got, expect, atol=1e-4, rtol=1e-4)
    y = torch.randn(rows, 64, device=device)
    # rank r multiplies its half of the input columns (its heads' attention output)
    summed = sum(RowParallelLinear(o_proj, s)(y.chunk(2, 1)[s.rank]) for s in shards)
    torch.testing.assert_close(summed, o_proj(y), atol=1e-4, rtol=1e-4)


def _experts(device: str, fmt: str, e: int, inner: int) -> ExpertWeights:
    w = _source(device, fmt)
    router = w.get("router", (e, H))
    if fmt == "mxfp4":
        assert isinstance(w, QuantizingWeights)
        gate_up = w.mxfp4("up", (e, 2 * inner, H))
        down = w.mxfp4("down", (e, H, inner), "out")
        assert isinstance(gate_up, Mxfp4Experts) and isinstance(down, Mxfp4Experts)
        return ExpertWeights(router, None, gate_up, w.get("ub", (e, 2 * inner)), down,
                             w.get("db", (e, H)))  # fmt: skip
    rows = [[f"e{j}.gate", f"e{j}.up"] for j in range(e)]
    ups = stacked_experts(w, rows, [(inner, H), (inner, H)])
    downs = stacked_experts(w, [[f"e{j}.down"] for j in range(e)], [(H, inner)], "out")
    assert isinstance(ups, Fp8Experts) == (fmt != "dense")
    routed = ExpertWeights(router, None, ups, None, downs, None)
    shared_up = linear(w, ["s.gate", "s.up"], [(2 * inner, H)] * 2).weight
    shared_down = linear(w, ["s.down"], [(H, 2 * inner)], "out").weight
    return routed.with_shared(shared_up, shared_down)  # two shared experts


@pytest.mark.parametrize(
    ("expert_parallel", "fmt", "pairs"),  # pairs 0: the grouped GEMM, else the expert GEMV
    [(ep, fmt, 0 if (ep and fmt == "dense") else 64) for ep in (False, True)
     for fmt in ("dense", "fp8-block", "mxfp4")],
)  # fmt: skip
def test_moe_parts_sum_to_the_whole(
    device: str, group: dist.ProcessGroup, fmt: str, pairs: int, expert_parallel: bool
) -> None:
    e, inner = 6, 64  # MXFP4 cuts whole 32-column groups of the expert width
    w = _experts(device, fmt, e, inner)
    moe = MoeConfig(e, 2, inner, True, (True,), shared_intermediate_size=w.shared * inner)
    act = "silu"
    if fmt == "mxfp4":  # gpt-oss: biased experts, the clamped SwiGLU
        moe, act = replace(moe, swiglu_limit=7.0), "swiglu_clamp"
    whole = MoE(moe, w, act, gemv_max_pairs=pairs)
    x = torch.randn(5, H, device=device)
    parts = [ParallelMoE(whole, Shard(r, 2, group), expert_parallel) for r in (0, 1)]
    if expert_parallel:  # three routed experts each, the shared ones on rank 0
        held = [p.w.down.scales.shape[0] if fmt == "mxfp4" else _count(p.w.down) for p in parts]
        assert held == [3 + w.shared, 3]
    summed = sum(part(x).float() for part in parts)
    torch.testing.assert_close(summed, whole(x).float(), atol=2e-3, rtol=2e-3)


def _count(stack: object) -> int:
    return int(stack.w.shape[0] if isinstance(stack, Fp8Experts) else stack.shape[0])  # type: ignore[attr-defined]


def test_v4_fp4_moe_parts_sum_to_the_whole(device: str, group: dist.ProcessGroup) -> None:
    """DeepSeek-V4's MoE layers with FP4 experts spread over 2 ranks (`parallel_v4_moe`): the
    hash layer (its token table names global expert ids) and a top-k layer; the shared
    expert, beside the FP4 stack, runs whole on rank 0 before the sum (folded into the stack
    it is `test_parallel.py`'s `v4-ep` case). The parts sum to the whole layer's output."""
    from resin_model.presets import preset
    from resin_models_cuda import RunnerOptions
    from resin_models_cuda.parallel import ParallelStyle, check_shardable, parallel_v4_moe
    from resin_models_cuda.runner import random_runner

    options = RunnerOptions(page_size=16, max_batch=2, max_context=64, num_pages=16)
    config = preset("tiny-deepseek_v4")
    model = random_runner(config, options, device, torch.float32, quantize="mxfp4").model  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="no tensor-parallel plan"):  # attention stays whole
        check_shardable(model, 2, ParallelStyle())
    with pytest.raises(ValueError, match="4 experts do not spread over 8 ranks"):
        check_shardable(model, 8, ParallelStyle(tensor=False, experts="expert"))
    gen = torch.Generator().manual_seed(4)
    x = torch.randn(5, config.hidden_size, generator=gen).to(device)
    ids = torch.randint(0, config.vocab_size, (5,), generator=gen).to(device)
    for layer in (model.layers[0], model.layers[-1]):  # hash-routed, then top-k
        whole = layer.moe
        parts = [parallel_v4_moe(whole, Shard(r, 2, group), True) for r in (0, 1)]
        assert whole.shared is not None and all(p.shared is None for p in parts)
        assert [p.moe.w.down.scales.shape[0] for p in parts] == [2, 2]  # of 4 routed experts
        assert [p.moe.extra is not None for p in parts] == [True, False]
        summed = sum(p(x, ids).float() for p in parts)
        torch.testing.assert_close(summed, whole(x, ids).float(), atol=2e-3, rtol=2e-3)
