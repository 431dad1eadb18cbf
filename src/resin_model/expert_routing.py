"""DeepSeek's expert routing rule, shared by the reference and the fast runner (it is part of
the model description: both families must choose the same experts with the same weights)."""

from __future__ import annotations

import torch

from resin_model.config import MoeConfig


def deepseek_route(
    logits: torch.Tensor, score_bias: torch.Tensor | None, moe: MoeConfig
) -> tuple[torch.Tensor, torch.Tensor]:
    """Router logits [T, E] (float32) -> (weights [T, k] float32, chosen expert ids [T, k]).

    V3: sigmoid scores, a correction bias that steers the choice but not the weights, groups
    scored by their two best experts. V2: softmax scores, groups scored by their best expert.
    V4: sqrt(softplus) scores (one group, the correction bias, always renormalized).
    Only the `topk_groups` best groups compete; weights are renormalized when the config says
    so and scaled by `routed_scale`."""
    sigmoid = moe.scoring == "sigmoid"
    if moe.scoring == "sqrtsoftplus":
        scores = torch.nn.functional.softplus(logits).sqrt()
    else:
        scores = logits.sigmoid() if sigmoid else logits.softmax(dim=-1)
    choice = scores if score_bias is None else scores + score_bias.float()
    if moe.topk_groups < moe.num_groups:
        grouped = choice.view(logits.shape[0], moe.num_groups, -1)
        if sigmoid:  # V3: a group scores the sum of its two best experts
            group_scores = grouped.topk(2, dim=-1).values.sum(dim=-1)
        else:  # V2 group_limited_greedy: its best expert
            group_scores = grouped.max(dim=-1).values
        kept = group_scores.topk(moe.topk_groups, dim=-1).indices
        keep = torch.zeros_like(group_scores, dtype=torch.bool).scatter_(1, kept, True)
        keep = keep.repeat_interleave(moe.num_experts // moe.num_groups, dim=1)
        choice = choice.masked_fill(~keep, float("-inf"))
    chosen = choice.topk(moe.top_k, dim=-1).indices
    weights = scores.gather(1, chosen)
    if moe.norm_topk_prob:
        weights = weights / (weights.sum(dim=-1, keepdim=True) + 1e-20)
    return weights * moe.routed_scale, chosen
