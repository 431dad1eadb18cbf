# mypy: disable-error-code="untyped-decorator,no-untyped-def"
"""MoE router top-k in one launch per step: scores (softmax or sigmoid over the router logits),
optional group-limited choice (DeepSeek), the k best experts, optional renormalization and
scale, per token; shared experts can be appended as always-chosen experts of weight 1.

Equals `resin_model.expert_routing.deepseek_route` (which, with one group and no bias, is
`scores.topk(k)` + `w / w.sum()`), with ties broken toward the lower expert id as `torch.topk`
does in practice. gpt-oss's "softmax over the top-k logits" is the same as softmax over all,
top-k, renormalize. The experts are held as a `[groups, experts per group]` tile.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from resin_model.config import MoeConfig
from resin_models_cuda.kernels.paged import next_pow2


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
    SIGMOID: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    RENORMALIZE: tl.constexpr,
):
    t = tl.program_id(0).to(tl.int64)
    g = tl.arange(0, G_PAD)[:, None]
    e = g * PER_GROUP + tl.arange(0, PER_PAD)[None, :]  # expert ids, [G_PAD, PER_PAD]
    valid = (g < GROUPS) & (tl.arange(0, PER_PAD)[None, :] < PER_GROUP)
    x = tl.load(logits_ptr + t * stride_l + e, mask=valid, other=float("-inf")).to(tl.float32)
    if SIGMOID:
        scores = tl.sigmoid(x)
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
        if SIGMOID:  # a group scores the sum of its two best experts
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


def router_topk(
    logits: torch.Tensor,
    moe: MoeConfig,
    score_bias: torch.Tensor | None = None,
    shared: int = 0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """`logits` [T, E] -> (weights fp32 [T, k + shared], experts int32 [T, k + shared]): the
    routing rule `moe` describes (`MoeConfig.scoring`, `num_groups` / `topk_groups`,
    `norm_topk_prob`, `routed_scale`; `score_bias` fp32 [E] steers the choice only); `shared`
    experts numbered E.. follow with weight 1."""
    assert logits.dim() == 2 and logits.stride(1) == 1
    t, e = logits.shape
    k = moe.top_k
    assert e == moe.num_experts and 1 <= k <= e and e % moe.num_groups == 0
    if score_bias is not None:
        assert score_bias.shape == (e,) and score_bias.dtype == torch.float32
    width = k + shared
    weight = torch.empty((t, width), dtype=torch.float32, device=logits.device)
    expert = torch.empty((t, width), dtype=torch.int32, device=logits.device)
    per_group = e // moe.num_groups
    if t:
        _router_topk_kernel[(t,)](
            logits, logits if score_bias is None else score_bias, weight, expert,
            logits.stride(0), moe.routed_scale, E=e, GROUPS=moe.num_groups,
            G_PAD=next_pow2(moe.num_groups), PER_GROUP=per_group, PER_PAD=next_pow2(per_group),
            TOPK_GROUPS=moe.topk_groups, K=k, SHARED=shared, OUT_PAD=next_pow2(width),
            SIGMOID=moe.scoring == "sigmoid", HAS_BIAS=score_bias is not None,
            RENORMALIZE=moe.norm_topk_prob, num_warps=1 if e <= 128 else 2,
        )  # fmt: skip
    return weight, expert
