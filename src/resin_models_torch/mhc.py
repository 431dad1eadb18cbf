"""Manifold-constrained hyper-connections (mHC; DeepSeek-V4, GLM-5.3): the residual is `n`
parallel streams per token instead of one vector.

Before each sub-block (attention or MLP), `HyperConnection` reads the token's streams and
derives three mixing weights from one linear map of their flattened, unweighted-RMS-normed
concatenation (all float32): `pre` [n] collapses the streams into the block's input, `post` [n]
spreads the block's output back over the streams, and `comb` [n, n], projected towards a doubly
stochastic matrix by Sinkhorn iterations, mixes the old streams into the new ones
(`hc_mix`). At the end `HyperHead` collapses the streams once more with sigmoid weights
(DeepSeek-V4; GLM-5.3 takes their plain mean). Every operation is per token: nothing is carried
across tokens, so mHC needs no cache.

Parameters keep float32 in a model of any dtype (`Float32Module`), as transformers keeps
them; a checkpoint's bf16 values load exactly.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from resin_models_torch.layers import Float32Module


def unweighted_rms_norm(x: torch.Tensor, eps: float) -> torch.Tensor:
    """x / rms(x) over the last dim, the scale computed in float32 and cast to x's dtype."""
    scale = torch.rsqrt(x.float().square().mean(-1, keepdim=True) + eps)
    return x * scale.to(x.dtype)


def sinkhorn(weights: torch.Tensor, iterations: int, eps: float) -> torch.Tensor:
    """[..., n, n] positive weights towards doubly stochastic: one column normalisation, then
    `iterations - 1` rounds of (rows, columns)."""
    weights = weights / (weights.sum(dim=-2, keepdim=True) + eps)
    for _ in range(iterations - 1):
        weights = weights / (weights.sum(dim=-1, keepdim=True) + eps)
        weights = weights / (weights.sum(dim=-2, keepdim=True) + eps)
    return weights


class HyperConnection(Float32Module):
    """One sub-block's mHC: `fn` [(2 + n) * n, n * hidden], `base` [(2 + n) * n], `scale` [3]
    (pre, post, comb)."""

    def __init__(self, hidden: int, mult: int, iterations: int, eps: float, norm_eps: float):
        super().__init__()
        self.mult, self.iterations, self.eps, self.norm_eps = mult, iterations, eps, norm_eps
        width = (2 + mult) * mult
        self.fn = nn.Parameter(torch.empty(width, mult * hidden))
        self.base = nn.Parameter(torch.empty(width))
        self.scale = nn.Parameter(torch.empty(3))

    def forward(self, streams: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """streams [T, n, hidden] -> (post [T, n] fp32, comb [T, n, n] fp32, block input
        [T, hidden] in the streams' dtype)."""
        n = self.mult
        flat = unweighted_rms_norm(streams.flatten(1).float(), self.norm_eps)
        mixes = F.linear(flat, self.fn.float())
        pre_w, post_w, comb_w = mixes.split([n, n, n * n], dim=-1)
        pre_b, post_b, comb_b = self.base.float().split([n, n, n * n])
        pre_s, post_s, comb_s = self.scale.float().unbind(0)
        pre = torch.sigmoid(pre_w * pre_s + pre_b) + self.eps
        post = 2 * torch.sigmoid(post_w * post_s + post_b)
        comb_logits = comb_w.view(-1, n, n) * comb_s + comb_b.view(n, n)
        comb = sinkhorn(torch.softmax(comb_logits, dim=-1) + self.eps, self.iterations, self.eps)
        collapsed = (pre[..., None] * streams).sum(dim=1).to(streams.dtype)
        return post, comb, collapsed


def hc_mix(
    streams: torch.Tensor, post: torch.Tensor, comb: torch.Tensor, out: torch.Tensor
) -> torch.Tensor:
    """New streams [T, n, hidden] after a block: `post` spreads its output `out` [T, hidden],
    plus comb^T mixes the old streams (comb is not symmetric: new stream k sums
    comb[j, k] * old stream j). Weights are cast to the streams' dtype first."""
    dtype = streams.dtype
    mixed = torch.matmul(comb.to(dtype).transpose(-1, -2), streams)
    return post.to(dtype)[..., None] * out[:, None, :] + mixed


class HyperHead(Float32Module):
    """DeepSeek-V4's final collapse: `hc_fn` [n, n * hidden], `hc_base` [n], `hc_scale` [1];
    the streams are summed with weights sigmoid(mix * scale + base) + eps."""

    def __init__(self, hidden: int, mult: int, eps: float, norm_eps: float) -> None:
        super().__init__()
        self.eps, self.norm_eps = eps, norm_eps
        self.hc_fn = nn.Parameter(torch.empty(mult, mult * hidden))
        self.hc_base = nn.Parameter(torch.empty(mult))
        self.hc_scale = nn.Parameter(torch.empty(1))

    def forward(self, streams: torch.Tensor) -> torch.Tensor:
        """streams [T, n, hidden] -> [T, hidden] in the streams' dtype."""
        flat = unweighted_rms_norm(streams.flatten(1).float(), self.norm_eps)
        mixes = F.linear(flat, self.hc_fn.float())
        pre = torch.sigmoid(mixes * self.hc_scale.float() + self.hc_base.float()) + self.eps
        return (pre[..., None] * streams).sum(dim=1).to(streams.dtype)
