# mypy: disable-error-code="untyped-decorator,no-untyped-def"
"""MoE router top-k in one launch per step: scores (softmax, sigmoid or DeepSeek-V4's
`sqrt(softplus)` over the router logits), optional group-limited choice (DeepSeek), the k best
experts, optional renormalization and scale, per token; shared experts can be appended as
always-chosen experts of weight 1.

Hash routing (DeepSeek-V4's first layers): the experts are not chosen from the scores but read
from a token-id table (`table[ids[t]]`, a gather in the kernel); their weights are still the
scores at those experts, renormalized and scaled as the chosen ones would be.

Equals `resin_model.expert_routing.deepseek_route` (which, with one group and no bias, is
`scores.topk(k)` + `w / w.sum()`), with ties broken toward the lower expert id as `torch.topk`
does in practice. gpt-oss's "softmax over the top-k logits" is the same as softmax over all,
top-k, renormalize. With a group limit the experts are held as a `[groups, experts per group]`
tile, a token a program; without one (and for hash routing) a program takes up to 16 tokens
as a `[tokens, experts]` tile.

Decode sizes (1-16 tokens) can take the router linear into the same launch
(`fused_router_topk`): programs split over the experts compute the logits and the program that
finishes last routes every token through the same `@triton.jit` helpers (`_route_grouped`,
`_route_flat`) the two kernels above call, so the rule exists once.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import triton
import triton.language as tl

from resin_model.config import MoeConfig
from resin_models_cuda.kernels.paged import next_pow2
from resin_models_cuda.kernels.pdl import pdl_args, pdl_enter


@triton.jit
def _router_topk_kernel(
    logits_ptr,  # [T, E] (any float dtype), row stride stride_l
    bias_ptr,  # fp32 [E]: choice-only score bias (read when HAS_BIAS)
    weight_ptr,  # fp32 [T, K + SHARED] contiguous
    expert_ptr,  # int32 [T, K + SHARED] contiguous
    stride_l,
    routed_scale,
    E: tl.constexpr,
    GROUPS: tl.constexpr,
    G_PAD: tl.constexpr,
    PER_GROUP: tl.constexpr,
    PER_PAD: tl.constexpr,
    TOPK_GROUPS: tl.constexpr,
    K: tl.constexpr,
    SHARED: tl.constexpr,  # experts E .. E + SHARED - 1, weight 1, after the routed ones
    OUT_PAD: tl.constexpr,
    SCORING: tl.constexpr,  # 0 softmax, 1 sigmoid, 2 sqrt(softplus)
    HAS_BIAS: tl.constexpr,
    RENORMALIZE: tl.constexpr,
    PDL: tl.constexpr,
):
    """Group-limited choice, a token a program (`_route_grouped`)."""
    pdl_enter(PDL)
    _route_grouped(
        logits_ptr, bias_ptr, weight_ptr, expert_ptr, tl.program_id(0).to(tl.int64), stride_l,
        routed_scale, E, GROUPS, G_PAD, PER_GROUP, PER_PAD, TOPK_GROUPS, K, SHARED, OUT_PAD,
        SCORING, HAS_BIAS, RENORMALIZE,
    )  # fmt: skip


@triton.jit
def _route_grouped(
    logits_ptr,
    bias_ptr,
    weight_ptr,
    expert_ptr,
    t,  # the token (int64 where the offsets may need it)
    stride_l,
    routed_scale,
    E: tl.constexpr,
    GROUPS: tl.constexpr,
    G_PAD: tl.constexpr,
    PER_GROUP: tl.constexpr,
    PER_PAD: tl.constexpr,
    TOPK_GROUPS: tl.constexpr,
    K: tl.constexpr,
    SHARED: tl.constexpr,
    OUT_PAD: tl.constexpr,
    SCORING: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    RENORMALIZE: tl.constexpr,
):
    """The routing rule for token `t`, its experts held as a [groups, experts per group] tile
    (the arguments as `_router_topk_kernel`'s). The logits are read past L1 (`.cg`): the fused
    kernel's last program reads what other programs of the same launch wrote."""
    g = tl.arange(0, G_PAD)[:, None]
    e = g * PER_GROUP + tl.arange(0, PER_PAD)[None, :]  # expert ids, [G_PAD, PER_PAD]
    valid = (g < GROUPS) & (tl.arange(0, PER_PAD)[None, :] < PER_GROUP)
    x = tl.load(logits_ptr + t * stride_l + e, mask=valid, other=float("-inf"),
                cache_modifier=".cg").to(tl.float32)  # fmt: skip
    if SCORING == 1:
        scores = tl.sigmoid(x)
    elif SCORING == 2:
        scores = _sqrt_softplus(x, valid)
    else:
        p = tl.exp(x - tl.max(tl.max(x, 1), 0))
        scores = p / tl.sum(tl.sum(p, 1), 0)
    choice = scores
    if HAS_BIAS:
        choice += tl.load(bias_ptr + e, mask=valid, other=0.0)
    choice = tl.where(valid, choice, float("-inf"))
    if TOPK_GROUPS < GROUPS:
        best = tl.max(choice, 1)
        group_score = best
        if SCORING == 1:  # a group scores the sum of its two best experts
            first = tl.min(tl.where(choice == best[:, None], e, E), 1)
            group_score += tl.max(tl.where(e == first[:, None], float("-inf"), choice), 1)
        gi = tl.arange(0, G_PAD)
        group_score = tl.where(gi < GROUPS, group_score, float("-inf"))
        keep = tl.zeros([G_PAD], tl.int1)
        for _ in tl.static_range(TOPK_GROUPS):
            top = tl.max(group_score, 0)
            idx = tl.min(tl.where(group_score == top, gi, G_PAD), 0)
            keep = keep | (gi == idx)
            group_score = tl.where(gi == idx, float("-inf"), group_score)
        choice = tl.where(keep[:, None], choice, float("-inf"))
    col = tl.arange(0, OUT_PAD)
    chosen = tl.zeros([OUT_PAD], tl.int32)
    weights = tl.zeros([OUT_PAD], tl.float32)
    for j in tl.static_range(K):
        top = tl.max(tl.max(choice, 1), 0)
        idx = tl.min(tl.min(tl.where(choice == top, e, E), 1), 0)
        w = tl.sum(tl.sum(tl.where(e == idx, scores, 0.0), 1), 0)
        chosen = tl.where(col == j, idx, chosen)
        weights = tl.where(col == j, w, weights)
        choice = tl.where(e == idx, float("-inf"), choice)
    if RENORMALIZE:
        weights = weights / (tl.sum(weights, 0) + 1e-20)
    weights = weights * routed_scale
    shared = (col >= K) & (col < K + SHARED)
    chosen = tl.where(shared, E + col - K, chosen)
    weights = tl.where(shared, 1.0, weights)
    out = col < K + SHARED
    tl.store(weight_ptr + t * (K + SHARED) + col, weights, mask=out)
    tl.store(expert_ptr + t * (K + SHARED) + col, chosen, mask=out)


@triton.jit
def _sqrt_softplus(x, valid):
    """sqrt(softplus(x)) where `valid`, else 0. softplus as torch computes it: x itself above
    20, below it max(x, 0) + log1p(exp(-|x|)), log1p(y) taken as y * log(u) / (u - 1) with
    u = 1 + y (exact where u rounds to 1, where log(u) alone would lose y)."""
    y = tl.exp(-tl.abs(x))
    u = 1.0 + y
    log1p = tl.where(u == 1.0, y, y * tl.log(u) / tl.where(u == 1.0, 1.0, u - 1.0))
    softplus = tl.where(x > 20.0, x, tl.maximum(x, 0.0) + log1p)
    return tl.sqrt(tl.where(valid, softplus, 0.0))


@triton.jit
def _router_flat_kernel(
    logits_ptr,  # [T, E] (any float dtype), row stride stride_l
    bias_ptr,  # fp32 [E]: choice-only score bias (read when HAS_BIAS)
    ids_ptr,  # int [T]: token ids (read when HASH)
    table_ptr,  # int32 [V, K] contiguous: a token's experts (read when HASH)
    weight_ptr,  # fp32 [T, K + SHARED] contiguous
    expert_ptr,  # int32 [T, K + SHARED] contiguous
    T,
    stride_l,
    routed_scale,
    E: tl.constexpr,
    E_PAD: tl.constexpr,
    K: tl.constexpr,
    SHARED: tl.constexpr,
    OUT_PAD: tl.constexpr,
    BLOCK_T: tl.constexpr,
    SCORING: tl.constexpr,
    HASH: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    RENORMALIZE: tl.constexpr,
    GATED_SHARED: tl.constexpr,
    PDL: tl.constexpr,
):
    """`_router_topk_kernel` without group-limited choice, BLOCK_T tokens a program
    (`_route_flat`)."""
    pdl_enter(PDL)
    _route_flat(
        logits_ptr, bias_ptr, ids_ptr, table_ptr, weight_ptr, expert_ptr,
        tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T), T, stride_l, routed_scale, E, E_PAD,
        K, SHARED, OUT_PAD, BLOCK_T, SCORING, HASH, HAS_BIAS, RENORMALIZE, GATED_SHARED,
    )  # fmt: skip


@triton.jit
def _route_flat(
    logits_ptr,
    bias_ptr,
    ids_ptr,
    table_ptr,
    weight_ptr,
    expert_ptr,
    rows,  # [BLOCK_T] token rows; those past T repeat the last token and are not stored
    T,
    stride_l,
    routed_scale,
    E: tl.constexpr,
    E_PAD: tl.constexpr,
    K: tl.constexpr,
    SHARED: tl.constexpr,
    OUT_PAD: tl.constexpr,
    BLOCK_T: tl.constexpr,
    SCORING: tl.constexpr,
    HASH: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    RENORMALIZE: tl.constexpr,
    GATED_SHARED: tl.constexpr = False,
):
    """The routing rule (no group limit) for the tokens `rows`, a [tokens, experts] tile (the
    arguments as `_router_flat_kernel`'s; logits read past L1 as in `_route_grouped`). With
    GATED_SHARED the shared experts weigh sigmoid(logits[:, E]) (one more router row: a
    shared-expert gate), rounded to the logits' dtype as a sigmoid in that dtype would be."""
    live = rows < T
    src = tl.minimum(rows, T - 1).to(tl.int64)
    e = tl.arange(0, E_PAD)[None, :]
    valid = (e < E) & (src[:, None] >= 0)
    x = tl.load(logits_ptr + src[:, None] * stride_l + e, mask=valid, other=float("-inf"),
                cache_modifier=".cg")  # fmt: skip
    x = x.to(tl.float32)
    if SCORING == 1:
        scores = tl.sigmoid(x)
    elif SCORING == 2:
        scores = _sqrt_softplus(x, valid)
    else:
        p = tl.exp(x - tl.max(x, 1)[:, None])
        scores = p / tl.sum(p, 1)[:, None]
    choice = scores
    if HAS_BIAS:
        choice += tl.load(bias_ptr + e, mask=e < E, other=0.0)
    choice = tl.where(valid, choice, float("-inf"))
    col = tl.arange(0, OUT_PAD)[None, :]
    chosen = tl.zeros([BLOCK_T, OUT_PAD], tl.int32)
    weights = tl.zeros([BLOCK_T, OUT_PAD], tl.float32)
    if HASH:
        token = tl.load(ids_ptr + src).to(tl.int64)
    for j in tl.static_range(K):
        if HASH:
            idx = tl.load(table_ptr + token * K + j)
        else:
            top = tl.max(choice, 1)
            idx = tl.min(tl.where(choice == top[:, None], e, E), 1)
        w = tl.sum(tl.where(e == idx[:, None], scores, 0.0), 1)
        chosen = tl.where(col == j, idx[:, None], chosen)
        weights = tl.where(col == j, w[:, None], weights)
        choice = tl.where(e == idx[:, None], float("-inf"), choice)
    if RENORMALIZE:
        weights = weights / (tl.sum(weights, 1)[:, None] + 1e-20)
    weights = weights * routed_scale
    shared = (col >= K) & (col < K + SHARED)
    chosen = tl.where(shared, E + col - K, chosen)
    if GATED_SHARED:
        gate = tl.load(logits_ptr + src * stride_l + E, cache_modifier=".cg").to(tl.float32)
        gate = _rounded(tl.sigmoid(gate), logits_ptr.dtype.element_ty).to(tl.float32)
        weights = tl.where(shared, gate[:, None], weights)
    else:
        weights = tl.where(shared, 1.0, weights)
    out = live[:, None] & (col < K + SHARED)
    offsets = rows[:, None].to(tl.int64) * (K + SHARED) + col
    tl.store(weight_ptr + offsets, weights, mask=out)
    tl.store(expert_ptr + offsets, chosen, mask=out)


@triton.jit
def _router_fused_kernel(
    x_ptr,  # [T, H] (any float dtype), row stride stride_x
    w_ptr,  # [E, H] contiguous: the router; its dtype is the logits' (as F.linear's output)
    b_ptr,  # [E]: the router's bias (read when HAS_ROUTER_BIAS)
    logits_ptr,  # [T, E] contiguous, w's dtype: scratch, each program's experts, then read
    ticket_ptr,  # int32 [1]: programs done in this launch; 0 before, 0 again after
    bias_ptr,  # fp32 [E]: choice-only score bias (read when HAS_BIAS)
    weight_ptr,  # fp32 [T, K + SHARED] contiguous
    expert_ptr,  # int32 [T, K + SHARED] contiguous
    T,
    stride_x,
    routed_scale,
    H: tl.constexpr,
    E: tl.constexpr,
    BLOCK_E: tl.constexpr,  # experts a program
    BLOCK_K: tl.constexpr,  # the K step of the logits' sums
    BLOCK_T: tl.constexpr,  # >= T
    SUB_T: tl.constexpr,  # tokens a [SUB_T, BLOCK_E, BLOCK_K] product takes
    E_PAD: tl.constexpr,
    GROUPED: tl.constexpr,  # group-limited choice (`_route_grouped`, a token at a time)
    GROUPS: tl.constexpr,
    G_PAD: tl.constexpr,
    PER_GROUP: tl.constexpr,
    PER_PAD: tl.constexpr,
    TOPK_GROUPS: tl.constexpr,
    K: tl.constexpr,
    SHARED: tl.constexpr,
    OUT_PAD: tl.constexpr,
    SCORING: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    HAS_ROUTER_BIAS: tl.constexpr,
    RENORMALIZE: tl.constexpr,
    PDL: tl.constexpr,
):
    """The router linear and the routing rule in one launch. Program p computes the logits
    of experts [p * BLOCK_E, (p + 1) * BLOCK_E) for every token (float32 sums of x in w's
    dtype times w, plus the bias, rounded to w's dtype: what `F.linear(x.to(w.dtype), w, b)`
    returns, up to the order of the sum), stores them, and takes a ticket; the program that
    takes the last one routes every token from the stored logits with the unfused kernels'
    code and puts the ticket back to 0 (no host read, so a CUDA graph replays it). The
    barrier before the ticket orders every thread's stores before the (acq_rel, GPU-scope)
    atomic; the last program reads the logits past L1."""
    pdl_enter(PDL)
    e = tl.program_id(0) * BLOCK_E + tl.arange(0, BLOCK_E)
    dtype = w_ptr.dtype.element_ty
    w_rows = w_ptr + e[:, None].to(tl.int64) * H
    for t0 in tl.static_range(0, BLOCK_T, SUB_T):  # after the first, w's rows come from L1
        sub = t0 + tl.arange(0, SUB_T)
        x_rows = x_ptr + sub[:, None].to(tl.int64) * stride_x
        part = tl.zeros([SUB_T, BLOCK_E, BLOCK_K], tl.float32)
        # unrolled, and summed over K only after the loop: no barrier between the steps, so
        # the loads of several steps are in flight together
        for k0 in tl.static_range(0, H, BLOCK_K):
            k = k0 + tl.arange(0, BLOCK_K)[None, :]
            w = tl.load(w_rows + k, mask=(e[:, None] < E) & (k < H), other=0.0).to(tl.float32)
            x = tl.load(x_rows + k, mask=(sub[:, None] < T) & (k < H), other=0.0)
            part += x.to(dtype).to(tl.float32)[:, None, :] * w[None, :, :]
        acc = tl.sum(part, 2)
        if HAS_ROUTER_BIAS:
            acc += tl.load(b_ptr + e, mask=e < E, other=0.0).to(tl.float32)[None, :]
        tl.store(logits_ptr + sub[:, None] * E + e[None, :], _rounded(acc, dtype),
                 mask=(sub[:, None] < T) & (e[None, :] < E))  # fmt: skip
    tl.debug_barrier()
    done = tl.atomic_add(ticket_ptr, 1, sem="acq_rel", scope="gpu")
    if done == tl.num_programs(0) - 1:
        tl.atomic_xchg(ticket_ptr, 0)
        if GROUPED:
            for t in range(T):
                _route_grouped(
                    logits_ptr, bias_ptr, weight_ptr, expert_ptr, t, E,
                    routed_scale, E, GROUPS, G_PAD, PER_GROUP, PER_PAD, TOPK_GROUPS, K, SHARED,
                    OUT_PAD, SCORING, HAS_BIAS, RENORMALIZE,
                )  # fmt: skip
        else:
            _route_flat(
                logits_ptr, bias_ptr, logits_ptr, logits_ptr, weight_ptr, expert_ptr,
                tl.arange(0, BLOCK_T), T, E,
                routed_scale, E, E_PAD, K, SHARED, OUT_PAD, BLOCK_T, SCORING, False, HAS_BIAS,
                RENORMALIZE,
            )  # fmt: skip


@triton.jit
def _rounded(x, dtype: tl.constexpr):
    """float32 `x` in `dtype`, to nearest, ties to even (as cuBLAS rounds its output). bf16
    by bit arithmetic: Triton's interpreter truncates a float32 -> bf16 cast, the GPU
    rounds; this is the same on both (finite values and infinities)."""
    if dtype == tl.bfloat16:
        bits = x.to(tl.uint32, bitcast=True)
        bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
        return bits.to(tl.float32, bitcast=True).to(dtype)
    return x.to(dtype)


_SCORING = {"softmax": 0, "sigmoid": 1, "sqrtsoftplus": 2}


def router_topk(
    logits: torch.Tensor,
    moe: MoeConfig,
    score_bias: torch.Tensor | None = None,
    shared: int = 0,
    table: torch.Tensor | None = None,
    ids: torch.Tensor | None = None,
    gated_shared: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """`logits` [T, E] -> (weights fp32 [T, k + shared], experts int32 [T, k + shared]): the
    routing rule `moe` describes (`MoeConfig.scoring`, `num_groups` / `topk_groups`,
    `norm_topk_prob`, `routed_scale`; `score_bias` fp32 [E] steers the choice only); `shared`
    experts numbered E.. follow with weight 1. With `table` (int32 [V, k], every entry an
    expert id < E) and the step's token `ids` [T], token t's experts are `table[ids[t]]`.
    `gated_shared`: `logits` is [T, E + 1], its last column a shared-expert gate, and the
    shared experts weigh `sigmoid(logits[:, E]).float()` (Qwen3.5's, in the same launch)."""
    assert logits.dim() == 2 and logits.stride(1) == 1
    t, e = logits.shape
    if gated_shared:
        assert shared >= 1 and table is None, "a gate needs shared experts; no hash routing"
        assert moe.topk_groups >= moe.num_groups, "a shared-expert gate under group-limited choice"
        e -= 1
    k = moe.top_k
    assert e == moe.num_experts and 1 <= k <= e and e % moe.num_groups == 0
    if score_bias is not None:
        assert score_bias.shape == (e,) and score_bias.dtype == torch.float32
    if table is not None:
        assert ids is not None and ids.shape == (t,) and table.dtype == torch.int32
        assert table.dim() == 2 and table.shape[1] == k and table.is_contiguous()
    width = k + shared
    weight = torch.empty((t, width), dtype=torch.float32, device=logits.device)
    expert = torch.empty((t, width), dtype=torch.int32, device=logits.device)
    per_group = e // moe.num_groups
    scoring = _SCORING[moe.scoring]
    ids_arg = logits if ids is None else ids
    table_arg = logits if table is None else table
    bias_arg = logits if score_bias is None else score_bias
    if t and (moe.topk_groups >= moe.num_groups or table is not None):
        block_t = min(16, next_pow2(t))
        e_pad = next_pow2(e)
        _router_flat_kernel[(triton.cdiv(t, block_t),)](
            logits, bias_arg, ids_arg, table_arg, weight, expert, t, logits.stride(0),
            moe.routed_scale, E=e, E_PAD=e_pad, K=k, SHARED=shared, OUT_PAD=next_pow2(width),
            BLOCK_T=block_t, SCORING=scoring, HASH=table is not None,
            HAS_BIAS=score_bias is not None, RENORMALIZE=moe.norm_topk_prob,
            GATED_SHARED=gated_shared,
            num_warps=4 if block_t * e_pad >= 2048 else 1, **pdl_args(),
        )  # fmt: skip
    elif t:
        _router_topk_kernel[(t,)](
            logits, bias_arg, weight, expert,
            logits.stride(0), moe.routed_scale, E=e, GROUPS=moe.num_groups,
            G_PAD=next_pow2(moe.num_groups), PER_GROUP=per_group, PER_PAD=next_pow2(per_group),
            TOPK_GROUPS=moe.topk_groups, K=k, SHARED=shared, OUT_PAD=next_pow2(width),
            SCORING=scoring, HAS_BIAS=score_bias is not None,
            RENORMALIZE=moe.norm_topk_prob, num_warps=1 if e <= 128 else 2, **pdl_args(),
        )  # fmt: skip
    return weight, expert


FUSED_MAX_TOKENS = 16  # `fused_router_topk` takes 1..16 tokens (decode); more: the linear


class FusedTiles(NamedTuple):
    """`fused_router_topk`'s launch shape: experts a program, the K step of the sums,
    tokens a product (`sub_t`), warps."""

    block_e: int
    block_k: int
    sub_t: int
    num_warps: int


def fused_tiles(tokens: int, experts: int, hidden: int, sms: int = 132) -> FusedTiles:
    """Experts a program: the fewest of 1, 2, 4, 8 that make at most `sms` programs (the
    H100's and H200's multiprocessors: one wave, each reading its rows of the ~0.2-7 MB
    router once). A [block_e, block_k] tile of the router of <= 2,048 values (16 a thread at
    4 warps), the K loop unrolled so that its loads are in flight together; `sub_t` tokens a
    product of <= 4,096 values. 8 warps where the routing's [tokens, experts] tile would
    spill at 4."""
    block_e = 1
    while block_e < 8 and triton.cdiv(experts, block_e) > sms:
        block_e *= 2
    block_t = next_pow2(tokens)
    block_k = max(16, min(next_pow2(hidden), 2048 // block_e))
    sub_t = max(1, min(block_t, 4096 // (block_e * block_k)))
    warps = 8 if block_t * next_pow2(experts) >= 4096 else 4
    return FusedTiles(block_e, block_k, sub_t, warps)


def fused_router_topk(
    x: torch.Tensor,
    router: torch.Tensor,
    router_bias: torch.Tensor | None,
    moe: MoeConfig,
    ticket: torch.Tensor,
    score_bias: torch.Tensor | None = None,
    shared: int = 0,
    tiles: FusedTiles | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """`router_topk(F.linear(x.to(router.dtype), router, router_bias), moe, score_bias,
    shared)` in one launch for 1..`FUSED_MAX_TOKENS` tokens: `x` [T, H], `router` [E, H]
    contiguous (its dtype is the logits' dtype: float32 for an `fp32_router` model), the
    same outputs. The logits' sums run in another order than cuBLAS's, so a choice between
    experts whose logits differ by an ulp can differ; ties break as `router_topk`'s (lowest
    id). `ticket` is int32 [1] holding 0, the launch's own counter (not shared with a
    launch that may run at the same time); the kernel leaves it 0. No hash routing."""
    t, h = x.shape
    e = router.shape[0]
    k = moe.top_k
    assert 1 <= t <= FUSED_MAX_TOKENS and x.stride(1) == 1
    assert router.shape == (e, h) and router.is_contiguous()
    assert e == moe.num_experts and 1 <= k <= e and e % moe.num_groups == 0
    assert ticket.shape == (1,) and ticket.dtype == torch.int32
    if score_bias is not None:
        assert score_bias.shape == (e,) and score_bias.dtype == torch.float32
    if router_bias is not None:
        assert router_bias.shape == (e,)
    tiles = tiles or fused_tiles(t, e, h)
    width = k + shared
    weight = torch.empty((t, width), dtype=torch.float32, device=x.device)
    expert = torch.empty((t, width), dtype=torch.int32, device=x.device)
    logits = torch.empty((t, e), dtype=router.dtype, device=x.device)
    per_group = e // moe.num_groups
    _router_fused_kernel[(triton.cdiv(e, tiles.block_e),)](
        x, router, router if router_bias is None else router_bias, logits, ticket,
        logits if score_bias is None else score_bias, weight, expert, t, x.stride(0),
        moe.routed_scale, H=h, E=e, BLOCK_E=tiles.block_e, BLOCK_K=tiles.block_k,
        BLOCK_T=next_pow2(t), SUB_T=min(tiles.sub_t, next_pow2(t)), E_PAD=next_pow2(e),
        GROUPED=moe.topk_groups < moe.num_groups, GROUPS=moe.num_groups,
        G_PAD=next_pow2(moe.num_groups), PER_GROUP=per_group, PER_PAD=next_pow2(per_group),
        TOPK_GROUPS=moe.topk_groups, K=k, SHARED=shared, OUT_PAD=next_pow2(width),
        SCORING=_SCORING[moe.scoring],
        HAS_BIAS=score_bias is not None, HAS_ROUTER_BIAS=router_bias is not None,
        RENORMALIZE=moe.norm_topk_prob, num_warps=tiles.num_warps, **pdl_args(),
    )  # fmt: skip
    return weight, expert
