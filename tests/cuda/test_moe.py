"""MoE layer: the expert GEMV and the fused grouped GEMM give the plain PyTorch result (softmax,
sigmoid and sqrt(softplus) routers, renormalized or not, expert biases, SiLU, gpt-oss's clamped
SwiGLU and DeepSeek-V4's clamped SiLU gate),
over odd token counts; the alignment puts every pair in exactly one block of its expert."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from resin_model.config import MoeConfig


def _reference(moe: MoeConfig, w, x: torch.Tensor, weight, expert, v4_limit=None) -> torch.Tensor:  # type: ignore[no-untyped-def]
    out = torch.zeros_like(x, dtype=torch.float32)
    for t in range(x.shape[0]):
        for j in range(moe.top_k):
            e = int(expert[t, j])
            gu = F.linear(
                x[t].float(),
                w.gate_up[e].float(),
                None if w.gate_up_bias is None else w.gate_up_bias[e].float(),
            )
            gate, up = gu.chunk(2)
            if v4_limit is not None:  # DeepSeek-V4: silu(min(gate, l)) * clamp(up, -l, l)
                act = F.silu(gate.clamp(max=v4_limit)) * up.clamp(-v4_limit, v4_limit)
            elif moe.swiglu_limit is not None:
                gate, up = gate.clamp(max=moe.swiglu_limit), up.clamp(-7.0, 7.0)
                act = (up + 1) * gate * torch.sigmoid(gate * moe.swiglu_alpha)
            else:
                act = F.silu(gate) * up
            y = F.linear(
                act, w.down[e].float(), None if w.down_bias is None else w.down_bias[e].float()
            )
            out[t] += weight[t, j] * y
    return out


@pytest.mark.parametrize("tokens", [1, 3, 37])
@pytest.mark.parametrize("variant", ["qwen", "gpt_oss", "sigmoid", "v4"])
def test_moe_paths_match_torch(device: str, tokens: int, variant: str) -> None:
    from resin_models_cuda.layers import ExpertWeights, MoE

    torch.manual_seed(tokens)
    e, h, inner, k = 6, 32, 24, 2
    moe = MoeConfig(
        e,
        k,
        inner,
        variant != "sigmoid",
        (True,),
        scoring={"sigmoid": "sigmoid", "v4": "sqrtsoftplus"}.get(variant, "softmax"),
        router_bias=variant == "gpt_oss",
        expert_bias=variant == "gpt_oss",
        swiglu_limit=7.0 if variant == "gpt_oss" else None,
    )

    def r(*shape: int) -> torch.Tensor:
        return (torch.randn(shape) * 0.5).to(device)

    bias = variant == "gpt_oss"
    w = ExpertWeights(
        r(e, h),
        r(e) if bias else None,
        r(e, 2 * inner, h),
        r(e, 2 * inner) if bias else None,
        r(e, h, inner),
        r(e, h) if bias else None,
    )
    act = {"gpt_oss": "swiglu_clamp", "v4": "silu_clamp"}.get(variant, "silu")
    limit = 1.0 if variant == "v4" else None  # clamps many of these gate / up values
    x = r(tokens, h)
    gemv = MoE(moe, w, act, gemv_max_pairs=10**6, limit=limit)  # type: ignore[arg-type]
    grouped = MoE(moe, w, act, gemv_max_pairs=0, limit=limit)  # type: ignore[arg-type]
    weight, expert = gemv.route(x)
    expect = _reference(moe, w, x, weight, expert, limit)
    for layer in (gemv, grouped):
        torch.testing.assert_close(layer(x).float(), expect, atol=2e-3, rtol=2e-3)


@pytest.mark.parametrize(("pairs", "experts", "block"), [(1, 4, 16), (37, 6, 16), (300, 8, 64)])
def test_align_pairs_blocks_hold_one_expert(
    device: str, pairs: int, experts: int, block: int
) -> None:
    from resin_models_cuda.kernels.moe_grouped import align_pairs

    ids = torch.randint(0, experts, (pairs,)).to(device)
    a = align_pairs(ids, experts, block)
    sorted_pairs = a.sorted_pairs.view(-1, block).cpu()
    block_expert = a.block_expert.cpu()
    seen = []
    for b in range(sorted_pairs.shape[0]):
        real = sorted_pairs[b][sorted_pairs[b] < pairs]
        if block_expert[b] < 0:
            assert real.numel() == 0
        else:
            assert torch.all(ids.cpu()[real.long()] == block_expert[b])
        seen += real.tolist()
    assert sorted(seen) == list(range(pairs))


ROUTES = {
    "qwen": dict(num_experts=12, top_k=3, norm_topk_prob=True),
    "no_renorm": dict(num_experts=12, top_k=3, norm_topk_prob=False),
    "sigmoid": dict(num_experts=12, top_k=2, norm_topk_prob=False, scoring="sigmoid"),
    # DeepSeek V3: sigmoid, correction bias, 4 of 8 groups by their two best, renorm, scale.
    "v3": dict(num_experts=32, top_k=4, norm_topk_prob=True, scoring="sigmoid",
               num_groups=8, topk_groups=4, routed_scale=2.5, score_bias=True),
    # DeepSeek V2: softmax, group-limited greedy over groups that are no power of two.
    "v2_groups": dict(num_experts=30, top_k=3, norm_topk_prob=False, num_groups=5,
                      topk_groups=2, routed_scale=16.0),
    # DeepSeek V4: sqrt(softplus), correction bias, renorm, scale; 20 tokens (two programs)
    "v4": dict(num_experts=20, top_k=6, norm_topk_prob=True, scoring="sqrtsoftplus",
               routed_scale=1.5, score_bias=True),
}  # fmt: skip


@pytest.mark.parametrize("shared", [0, 2])
@pytest.mark.parametrize("name", sorted(ROUTES))
def test_router_kernel_is_the_routing_rule(device: str, name: str, shared: int) -> None:
    """The router kernel chooses the experts and weights of `deepseek_route` (the shared
    routing rule; with one group and no bias, plain top-k), shared experts appended."""
    from resin_model.expert_routing import deepseek_route
    from resin_models_cuda.kernels.router import router_topk

    spec: dict = dict(ROUTES[name])
    moe = MoeConfig(intermediate_size=8, sparse_layers=(True,), **spec)
    torch.manual_seed(len(name) + shared)
    tokens = 20 if name == "v4" else 9
    logits = torch.randn(tokens, moe.num_experts).to(device)
    if name == "v4":  # softplus's far tails: torch's x above 20, exp(x) far below 0
        logits[0, :4] = torch.tensor([25.0, 19.5, -30.0, -90.0])
    bias = torch.randn(moe.num_experts).to(device) * 0.1 if moe.score_bias else None
    weight, expert = router_topk(logits, moe, bias, shared)
    ref_weight, ref_expert = deepseek_route(logits, bias, moe)
    k = moe.top_k
    assert torch.equal(expert[:, :k].long().cpu(), ref_expert.cpu())
    torch.testing.assert_close(weight[:, :k], ref_weight, atol=1e-6, rtol=1e-5)
    e = moe.num_experts
    want = torch.arange(e, e + shared).expand(tokens, shared).int()
    assert torch.equal(expert[:, k:].cpu(), want)
    assert torch.all(weight[:, k:] == 1.0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("shared", [1, 2])
def test_router_kernel_weighs_shared_experts_by_their_gate(
    device: str, shared: int, dtype: torch.dtype
) -> None:
    """Qwen3.5's shared-expert gate as the router's last column (`gated_shared`): the routed
    choice is the first E columns' and the shared experts weigh sigmoid(gate) as
    `torch.sigmoid` in the logits' dtype, then float32, does (what the model did in three more
    launches)."""
    from resin_models_cuda.kernels.router import router_topk

    moe = MoeConfig(intermediate_size=8, sparse_layers=(True,), **ROUTES["qwen"])
    e, k = moe.num_experts, moe.top_k
    torch.manual_seed(shared)
    logits = (torch.randn(9, e + 1) * 3).to(dtype).to(device)
    weight, expert = router_topk(logits, moe, None, shared, gated_shared=True)
    want_weight, want_expert = router_topk(logits[:, :e].contiguous(), moe, None, shared)
    assert torch.equal(expert.cpu(), want_expert.cpu())
    assert torch.equal(weight[:, :k].cpu(), want_weight[:, :k].cpu())
    gate = torch.sigmoid(logits[:, e:]).float().expand(-1, shared)
    # bf16: the same rounded value; float32: torch's and Triton's sigmoid within an ulp or two
    tolerance = dict(atol=0.0, rtol=0.0) if dtype == torch.bfloat16 else dict(atol=0, rtol=3e-7)
    torch.testing.assert_close(weight[:, k:].cpu(), gate.cpu(), **tolerance)
    assert not torch.all(weight[:, k:] == 1.0)


def test_shared_experts_fold_into_the_expert_stack(device: str) -> None:
    """`with_shared`: a dense gated MLP twice the expert width runs as two always-on experts
    (DeepSeek's shared experts), on both MoE paths."""
    from resin_models_cuda.layers import ExpertWeights, MoE

    torch.manual_seed(0)
    e, h, inner, k = 6, 32, 8, 2
    moe = MoeConfig(e, k, inner, True, (True,), shared_intermediate_size=2 * inner)

    def r(*shape: int) -> torch.Tensor:
        return (torch.randn(shape) * 0.5).to(device)

    routed = ExpertWeights(r(e, h), None, r(e, 2 * inner, h), None, r(e, h, inner), None)
    shared_gate_up, shared_down = r(4 * inner, h), r(h, 2 * inner)
    folded = routed.with_shared(shared_gate_up, shared_down)
    assert folded.shared == 2 and folded.gate_up.shape[0] == e + 2
    x = r(5, h)
    weight, expert = MoE(moe, routed, "silu").route(x)
    gate, up = F.linear(x, shared_gate_up).chunk(2, dim=-1)
    dense = F.linear(F.silu(gate) * up, shared_down)
    expect = _reference(moe, routed, x, weight, expert) + dense
    for pairs in (10**6, 0):  # expert GEMV, grouped GEMM
        layer = MoE(moe, folded, "silu", gemv_max_pairs=pairs)
        torch.testing.assert_close(layer(x).float(), expect, atol=2e-3, rtol=2e-3)


@pytest.mark.parametrize("routed", ["fp8", "dense"])
def test_quantized_shared_expert_folds_into_the_stack(device: str, routed: str) -> None:
    """GLM-4.5-Air-FP8 / DeepSeek-V3's layout: an FP8 shared expert (128 x 128 scale blocks,
    a shared width of two experts that cuts those blocks) beside FP8 routed experts stays
    FP8, beside dense ones is dequantized into the stack; either equals the MoE of the
    dequantized weights on both paths. MXFP4 routed experts with a shared one are refused."""
    from resin_model.quant import dequantize_fp8, quantize_fp8
    from resin_models_cuda.kernels.moe_fp8 import Fp8Experts
    from resin_models_cuda.kernels.moe_mxfp4 import Mxfp4Experts
    from resin_models_cuda.layers import ExpertWeights, MoE
    from resin_models_cuda.layers.quantized import Fp8Weight, stack_fp8

    torch.manual_seed(7)
    e, h, inner, k, block = 4, 160, 48, 2, (128, 128)
    moe = MoeConfig(e, k, inner, True, (True,), shared_intermediate_size=2 * inner)

    def fp8(*shape: int) -> Fp8Weight:
        return Fp8Weight(*quantize_fp8(torch.randn(shape) * 0.3, block), block)

    def dense(w: Fp8Weight) -> torch.Tensor:
        return dequantize_fp8(w.w, w.scale, w.block)

    def on(w: Fp8Weight) -> Fp8Weight:
        return Fp8Weight(w.w.to(device), w.scale.to(device), w.block)

    ups, downs = [fp8(2 * inner, h) for _ in range(e)], [fp8(h, inner) for _ in range(e)]
    shared_up, shared_down = fp8(4 * inner, h), fp8(h, 2 * inner)
    router = torch.randn(e, h).to(device)
    dense_up = torch.stack([dense(u) for u in ups]).to(device)
    dense_down = torch.stack([dense(d) for d in downs]).to(device)
    dense_routed = ExpertWeights(router, None, dense_up, None, dense_down, None)
    if routed == "fp8":
        base = ExpertWeights(router, None, stack_fp8([on(u) for u in ups]), None,
                             stack_fp8([on(d) for d in downs]), None)  # fmt: skip
    else:
        base = dense_routed
    folded = base.with_shared(on(shared_up), on(shared_down))
    assert folded.shared == 2
    assert isinstance(folded.gate_up, Fp8Experts) == (routed == "fp8")
    x = torch.randn(5, h).to(device)
    weight, expert = MoE(moe, base, "silu").route(x)
    gate, up = F.linear(x.float().cpu(), dense(shared_up)).chunk(2, dim=-1)
    want = _reference(moe, dense_routed, x, weight, expert).cpu()
    want += F.linear(F.silu(gate) * up, dense(shared_down))
    for pairs in (10**6, 0):  # expert GEMV, grouped GEMM
        got = MoE(moe, folded, "silu", gemv_max_pairs=pairs)(x).float().cpu()
        torch.testing.assert_close(got, want, atol=2e-3 * want.abs().max().item(), rtol=2e-3)
    mx = Mxfp4Experts(torch.zeros(e, 2 * inner, h // 32, 16, dtype=torch.uint8),
                      torch.zeros(e, 2 * inner, h // 32, dtype=torch.uint8))  # fmt: skip
    with pytest.raises(ValueError, match="Mxfp4Experts"):
        ExpertWeights(router, None, mx, None, mx, None).with_shared(shared_up, shared_down)
    with pytest.raises(ValueError, match="FP8 routed experts need FP8 shared"):
        base_fp8 = ExpertWeights(router, None, stack_fp8(ups), None, stack_fp8(downs), None)
        base_fp8.with_shared(dense(shared_up), dense(shared_down))


@pytest.mark.parametrize(
    "tiles",
    [(4, 128, 4, 1), (16, 64, 4, 1), (8, 32, 4, 2), (32, 128, 8, 1)],
)  # fmt: skip
def test_expert_gemv_launch_shapes_agree(device: str, tiles: tuple) -> None:
    """Every launch shape of the expert GEMV computes the same thing (tile sizes, warps,
    pipeline stages), biases and odd sizes included."""
    from resin_models_cuda.kernels.moe_gemv import (
        GemvTiles,
        expert_down,
        expert_gate_up,
    )

    torch.manual_seed(1)
    e, h, inner, k, t = 5, 40, 24, 3, 2
    t_ = GemvTiles(*tiles)
    x, w_up, w_dn = torch.randn(t, h), torch.randn(e, 2 * inner, h), torch.randn(e, h, inner)
    b_up, b_dn = torch.randn(e, 2 * inner), torch.randn(e, h)
    ids, scale = torch.randint(0, e, (t * k,), dtype=torch.int32), torch.rand(t * k)
    gate, up = torch.einsum("ph,pnh->pn", x.repeat_interleave(k, 0), w_up[ids.long()]).add(
        b_up[ids.long()]).chunk(2, dim=-1)  # fmt: skip
    act_ref = F.silu(gate) * up
    down_ref = torch.einsum("pi,phi->ph", act_ref, w_dn[ids.long()]) + b_dn[ids.long()]
    out_ref = (down_ref * scale[:, None]).view(t, k, h).sum(1)
    d = device
    act = expert_gate_up(x.to(d), w_up.to(d), ids.to(d), bias=b_up.to(d), row_div=k, tiles=t_)
    torch.testing.assert_close(act.cpu(), act_ref, atol=1e-3, rtol=1e-3)
    out = expert_down(act_ref.to(d), w_dn.to(d), ids.to(d), scale.to(d), k, bias=b_dn.to(d),
                      tiles=t_)  # fmt: skip
    torch.testing.assert_close(out.cpu(), out_ref, atol=1e-3, rtol=1e-3)
    one, unit = torch.zeros(t, dtype=torch.int32).to(d), torch.ones(t).to(d)
    w_dense = w_dn[0, :, :20].T.contiguous()[None].to(d)
    dense = expert_down(x.to(d), w_dense, one, unit, 1, bias=b_up[None, 0, :20].to(d), tiles=t_)
    torch.testing.assert_close(dense.cpu(), x @ w_dn[0, :, :20] + b_up[0, :20], atol=1e-3,
                               rtol=1e-3)  # fmt: skip


@pytest.mark.parametrize("hashed", [False, True], ids=["topk", "hash"])
def test_router_kernel_routes_as_the_v4_reference(device: str, hashed: bool) -> None:
    """DeepSeek-V4's routing in the router kernel equals the reference runner's `V4Router`:
    sqrt(softplus) scores, the top-k of score + correction bias (or, in a hash layer, the
    experts the token-id table names: a gather in the kernel), the unbiased scores of the
    chosen experts renormalised and scaled; a shared expert appended."""
    import torch.nn.functional as F

    from resin_model.hf_config import parse_config
    from resin_model.presets import PRESETS
    from resin_models_cuda.kernels.router import router_topk
    from resin_models_torch.deepseek_v4 import V4Router

    raw = {**PRESETS["tiny-deepseek_v4"], "n_routed_experts": 24, "num_experts_per_tok": 6}
    config = parse_config(raw)
    moe = config.moe
    assert moe is not None and moe.scoring == "sqrtsoftplus"
    torch.manual_seed(11)
    router = V4Router(config, hashed)
    with torch.no_grad():
        router.weight.normal_()
        if router.tid2eid is not None:
            table = torch.stack([torch.randperm(24)[:6] for _ in range(config.vocab_size)])
            router.tid2eid.copy_(table)
        else:
            assert router.e_score_correction_bias is not None
            router.e_score_correction_bias.normal_(0.0, 0.1)
    x = torch.randn(21, config.hidden_size)
    ids = torch.randint(0, config.vocab_size, (21,))
    with torch.no_grad():
        want_w, want_e = router(x, ids)
    logits = F.linear(x, router.weight).to(device)
    bias = router.e_score_correction_bias
    got_w, got_e = router_topk(
        logits, moe, None if bias is None else bias.detach().to(device), shared=1,
        table=None if router.tid2eid is None else router.tid2eid.int().to(device),
        ids=ids.to(device),
    )  # fmt: skip
    got_w, got_e = got_w.cpu(), got_e.cpu().long()
    assert torch.equal(got_e[:, 6], torch.full((21,), 24)) and torch.all(got_w[:, 6] == 1.0)
    # the reference's top-k is unsorted: compare the chosen experts in id order
    order_got, order_want = got_e[:, :6].argsort(dim=1), want_e.argsort(dim=1)
    assert torch.equal(got_e[:, :6].gather(1, order_got), want_e.gather(1, order_want))
    torch.testing.assert_close(got_w[:, :6].gather(1, order_got), want_w.gather(1, order_want),
                               atol=1e-6, rtol=1e-5)  # fmt: skip


FUSED_ROUTES = {
    **ROUTES,
    # gpt-oss: softmax over a biased linear, renormalized; odd expert count
    "gpt_oss": dict(num_experts=11, top_k=4, norm_topk_prob=True, router_bias=True),
    # GLM-5.3: sigmoid, correction bias, one group, renorm, scale; top-8 of an odd count
    "glm5": dict(num_experts=19, top_k=8, norm_topk_prob=True, scoring="sigmoid",
                 routed_scale=2.5, score_bias=True),
}  # fmt: skip
ROUTER_DTYPES = {  # (x, router): the router's dtype is the logits' (`fp32_router`: float32)
    "bf16": (torch.bfloat16, torch.bfloat16),
    "fp32_router": (torch.bfloat16, torch.float32),
    "fp32": (torch.float32, torch.float32),
}


def _grid(*shape: int, step: float, top: int) -> torch.Tensor:
    """Values k * step, |k| <= top: every product and partial sum of two such tensors is
    exact in float32, so the logits do not depend on the order of the sum."""
    return torch.randint(-top, top + 1, shape) * step


@pytest.mark.parametrize("tokens", [1, 6, 16])
@pytest.mark.parametrize("dtype", sorted(ROUTER_DTYPES))
@pytest.mark.parametrize("name", sorted(FUSED_ROUTES))
def test_fused_router_equals_linear_and_topk(
    device: str, name: str, dtype: str, tokens: int
) -> None:
    """`fused_router_topk` (the router linear and the routing rule in one launch) returns
    what `F.linear(x.to(w.dtype), w, b)` + `router_topk` return, for every rule, bf16 and
    float32 logits, odd hidden sizes and expert counts, 1..16 tokens, shared experts
    appended. The inputs sit on a grid where the float32 sums are exact, so the logits are
    the same bits on both paths and ties (frequent in bf16) must break the same way; off the
    grid the sums' order may move a logit by an ulp (the kernel's docstring)."""
    from resin_models_cuda.kernels.router import fused_router_topk, router_topk

    spec: dict = dict(FUSED_ROUTES[name])
    moe = MoeConfig(intermediate_size=8, sparse_layers=(True,), **spec)
    x_dtype, w_dtype = ROUTER_DTYPES[dtype]
    e, h, shared = moe.num_experts, 67, 1 + tokens % 2
    torch.manual_seed(tokens * 31 + len(name))
    x = _grid(tokens, h, step=0.25, top=4).to(x_dtype).to(device)
    w = _grid(e, h, step=1 / 16, top=8).to(w_dtype).to(device)
    b = _grid(e, step=1 / 8, top=8).to(w_dtype).to(device) if moe.router_bias else None
    bias = torch.randn(e).to(device) * 0.1 if moe.score_bias else None
    ticket = torch.zeros(1, dtype=torch.int32, device=device)
    want_w, want_e = router_topk(F.linear(x.to(w_dtype), w, b), moe, bias, shared)
    for _ in range(2):  # the ticket is back at 0 after each launch
        got_w, got_e = fused_router_topk(x, w, b, moe, ticket, bias, shared)
        assert int(ticket.item()) == 0
        assert torch.equal(got_e.cpu(), want_e.cpu())
        torch.testing.assert_close(got_w, want_w, atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("tiles", [(1, 16, 1, 1), (4, 32, 2, 2), (8, 128, 8, 4)])
def test_fused_router_launch_shapes_agree(device: str, tiles: tuple) -> None:
    """Every launch shape of the fused router routes the same (experts a program not dividing
    E, K steps past H, token blocks not dividing T, other warp counts), on random float32
    inputs."""
    from resin_models_cuda.kernels.router import FusedTiles, fused_router_topk, router_topk

    moe = MoeConfig(intermediate_size=8, sparse_layers=(True,), **ROUTES["v3"])
    torch.manual_seed(3)
    x, w = torch.randn(5, 93).to(device), torch.randn(32, 93).to(device)
    bias = torch.randn(32).to(device) * 0.1
    ticket = torch.zeros(1, dtype=torch.int32, device=device)
    got_w, got_e = fused_router_topk(x, w, None, moe, ticket, bias, tiles=FusedTiles(*tiles))
    want_w, want_e = router_topk(F.linear(x, w), moe, bias)
    assert torch.equal(got_e.cpu(), want_e.cpu()) and int(ticket.item()) == 0
    torch.testing.assert_close(got_w, want_w, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("arch", ["gpt_oss", "glm4_moe"])
def test_fast_moe_model_matches_reference_with_fused_router(
    device: str, arch: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A whole fast MoE model (gpt-oss: biased bf16-style router; GLM-4.5: sigmoid, group
    limit, float32 router and correction bias) gives the reference runner's greedy tokens
    with `MoE.fused_router` on, and its decode steps do route through the fused kernel."""
    from resin_model.presets import TINY
    from resin_models_cuda.kernels import router
    from resin_models_cuda.layers import moe as moe_layer
    from tests.cuda.test_vs_reference import _generate, _prompts, reference_and_fast

    calls = []

    def counted(*args, **kwargs):  # type: ignore[no-untyped-def]
        calls.append(args[0].shape[0])
        return router.fused_router_topk(*args, **kwargs)

    monkeypatch.setattr(moe_layer.MoE, "fused_router", True)
    monkeypatch.setattr(moe_layer, "fused_router_topk", counted)
    reference, fast = reference_and_fast(TINY[arch], device)
    prompts = _prompts(256, full=False)
    assert _generate(fast, prompts, 3) == _generate(reference, prompts, 3)
    assert calls and max(calls) <= router.FUSED_MAX_TOKENS


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["qwen3-30b-a3b", "glm-5.3-flash", "deepseek-v3-4l"])
def test_fused_router_replays_in_a_cuda_graph_gpu(name: str) -> None:
    """At a preset's real router shape, 24 fused launches (each layer its own weights and
    ticket) captured in one CUDA graph and replayed 20 times on changing inputs route as the
    unfused path on every replay, up to near-ties: a program reading logits before their
    writer's store is visible, or a ticket not back at 0, would show as wrong choices."""
    from resin_app.bench.router import Layers, shape_of

    shape = shape_of(name)
    layers = Layers.random(shape, 24, torch.device("cuda"))
    x = torch.randn(16, shape.hidden, device="cuda").to(torch.bfloat16)
    same = rows = 0
    for tokens in (1, 16):
        view = x[:tokens]
        layers.fused(view, None)  # compile outside the capture
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = layers.fused(view, None)
        for _ in range(20):
            x.normal_()
            graph.replay()
            want = layers.unfused(view)
            for (got_w, got_e), (want_w, want_e) in zip(out, want, strict=True):
                equal = (got_e == want_e).all(1)
                same, rows = same + int(equal.sum()), rows + tokens
                torch.testing.assert_close(got_w[equal], want_w[equal], atol=1e-2, rtol=1e-2)
        assert all(int(t.item()) == 0 for t in layers.tickets)
    assert same >= 0.98 * rows  # bf16 logits an ulp apart may flip a near-tie
