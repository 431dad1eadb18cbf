# mypy: disable-error-code="untyped-decorator,no-untyped-def"
"""MoE router top-k in one launch: scores (softmax or sigmoid over the router logits), the k
best experts, optional renormalization, per token.

Equals `scores.topk(k)` (+ `w / w.sum()`), with ties broken toward the lower expert id as
`torch.topk` does in practice. gpt-oss's "softmax over the top-k logits" is the same as
softmax over all, top-k, renormalize.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from resin_models_cuda.kernels.paged import next_pow2


@triton.jit
def _router_topk_kernel(
    logits_ptr,  # [T, E] (any float dtype), row stride stride_l
    weight_ptr,  # fp32 [T, K] contiguous
    expert_ptr,  # int32 [T, K] contiguous
    stride_l,
    E: tl.constexpr,
    E_PAD: tl.constexpr,
    K: tl.constexpr,
    SIGMOID: tl.constexpr,
    RENORMALIZE: tl.constexpr,
):
    t = tl.program_id(0).to(tl.int64)
    e = tl.arange(0, E_PAD)
    x = tl.load(logits_ptr + t * stride_l + e, mask=e < E, other=float("-inf")).to(tl.float32)
    if SIGMOID:
        scores = tl.where(e < E, tl.sigmoid(x), -1.0)
    else:
        p = tl.exp(x - tl.max(x, 0))
        scores = p / tl.sum(p, 0)
        scores = tl.where(e < E, scores, -1.0)
    total = 1.0
    if RENORMALIZE:  # a first pass sums the k best scores
        rest = scores
        total = 0.0
        for _ in tl.static_range(K):
            best = tl.max(rest, 0)
            total += best
            rest = tl.where(e == tl.min(tl.where(rest == best, e, E_PAD), 0), -2.0, rest)
    for j in tl.static_range(K):
        best = tl.max(scores, 0)
        idx = tl.min(tl.where(scores == best, e, E_PAD), 0)
        tl.store(weight_ptr + t * K + j, best / total)
        tl.store(expert_ptr + t * K + j, idx)
        scores = tl.where(e == idx, -2.0, scores)


def router_topk(
    logits: torch.Tensor, k: int, sigmoid: bool = False, renormalize: bool = True
) -> tuple[torch.Tensor, torch.Tensor]:
    """`logits` [T, E] -> (weights fp32 [T, k], experts int32 [T, k])."""
    assert logits.dim() == 2 and logits.stride(1) == 1
    t, e = logits.shape
    assert 1 <= k <= e
    weight = torch.empty((t, k), dtype=torch.float32, device=logits.device)
    expert = torch.empty((t, k), dtype=torch.int32, device=logits.device)
    if t:
        _router_topk_kernel[(t,)](
            logits,
            weight,
            expert,
            logits.stride(0),
            E=e,
            E_PAD=next_pow2(e),
            K=k,
            SIGMOID=sigmoid,
            RENORMALIZE=renormalize,
            num_warps=1 if e <= 128 else 2,
        )
    return weight, expert
