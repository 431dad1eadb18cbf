# mypy: disable-error-code="untyped-decorator,no-untyped-def"
"""Manifold-constrained hyper-connections (mHC; DeepSeek-V4, GLM-5.3): the per-token mixing
weights of `n` residual streams, in float32.

`hc_weights` takes the tokens' `mixes` (the float32 linear map of their RMS-normed flattened
streams: cuBLAS does that matmul) and computes in registers, 16 tokens a program, what would
otherwise be ~80 tiny launches: `pre = sigmoid(m_pre * s0 + b_pre) + eps`,
`post = 2 sigmoid(m_post * s1 + b_post)`, `comb = softmax_rows(m_comb * s2 + b_comb) + eps`,
then the Sinkhorn projection towards a doubly stochastic matrix (one column normalisation,
then `iterations - 1` rounds of rows and columns, each `x / (sum + eps)`), as
`resin_models_torch.mhc` does. `hc_head_weights` is the final collapse's
`sigmoid(m * s + b) + eps`. The collapse and the mix stay torch ops (a weighted sum over the
streams and one batched n x n matmul)."""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from resin_models_cuda.kernels.paged import next_pow2
from resin_models_cuda.kernels.pdl import pdl_args, pdl_enter


@triton.jit
def _hc_weights_kernel(
    mix_ptr,  # [T, (2 + n) * n] float32
    scale_ptr,  # [3] float32
    base_ptr,  # [(2 + n) * n] float32
    pre_ptr,  # [T, n] float32
    post_ptr,  # [T, n] float32
    comb_ptr,  # [T, n, n] float32
    T,
    eps,
    N: tl.constexpr,
    ITERS: tl.constexpr,
    BLOCK: tl.constexpr,
    BLOCK_T: tl.constexpr,
    PDL: tl.constexpr,
):
    pdl_enter(PDL)
    t = tl.program_id(0).to(tl.int64) * BLOCK_T + tl.arange(0, BLOCK_T)
    width = (2 + N) * N
    i = tl.arange(0, BLOCK)
    live = t < T
    vec = live[:, None] & (i[None, :] < N)  # [BLOCK_T, BLOCK]
    row = mix_ptr + t[:, None] * width
    s_pre = tl.load(scale_ptr)
    s_post = tl.load(scale_ptr + 1)
    s_comb = tl.load(scale_ptr + 2)
    b_pre = tl.load(base_ptr + i, mask=i < N, other=0.0)
    b_post = tl.load(base_ptr + N + i, mask=i < N, other=0.0)
    pre = tl.load(row + i[None, :], mask=vec, other=0.0) * s_pre + b_pre[None, :]
    tl.store(pre_ptr + t[:, None] * N + i[None, :], tl.sigmoid(pre) + eps, mask=vec)
    post = tl.load(row + N + i[None, :], mask=vec, other=0.0) * s_post + b_post[None, :]
    tl.store(post_ptr + t[:, None] * N + i[None, :], 2.0 * tl.sigmoid(post), mask=vec)
    # comb[t, r, c] at 2N + r * N + c of token t's row
    r, c = i[None, :, None], i[None, None, :]
    square = (r < N) & (c < N)  # [1, BLOCK, BLOCK]
    both = live[:, None, None] & square
    at = 2 * N + r * N + c
    base = tl.load(base_ptr + at, mask=square, other=0.0)
    logits = tl.load(mix_ptr + t[:, None, None] * width + at, mask=both, other=0.0) * s_comb
    logits = tl.where(square, logits + base, float("-inf"))
    top = tl.max(logits, 2)
    top = tl.where(i[None, :] < N, top, 0.0)  # a padding row has no finite logit
    e = tl.where(square, tl.exp(logits - top[:, :, None]), 0.0)
    total = tl.maximum(tl.sum(e, 2), 1e-30)  # >= 1 on a real row
    comb = tl.where(square, e / total[:, :, None] + eps, 0.0)
    comb = comb / (tl.sum(comb, 1)[:, None, :] + eps)
    for _ in tl.static_range(ITERS - 1):
        comb = comb / (tl.sum(comb, 2)[:, :, None] + eps)
        comb = comb / (tl.sum(comb, 1)[:, None, :] + eps)
    tl.store(comb_ptr + t[:, None, None] * N * N + r * N + c, comb, mask=both)


def hc_weights(
    mixes: torch.Tensor, scale: torch.Tensor, base: torch.Tensor, iterations: int, eps: float
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(pre [T, n], post [T, n], comb [T, n, n]), float32, of `mixes` [T, (2 + n) n] float32
    with the sub-block's `scale` [3] and `base` [(2 + n) n] (module docstring)."""
    t, width = mixes.shape
    n = math.isqrt(width + 1) - 1
    assert (2 + n) * n == width and scale.shape == (3,) and base.shape == (width,)
    assert mixes.dtype == torch.float32 and mixes.is_contiguous() and iterations >= 1
    pre = torch.empty((t, n), dtype=torch.float32, device=mixes.device)
    post = torch.empty_like(pre)
    comb = torch.empty((t, n, n), dtype=torch.float32, device=mixes.device)
    if t:
        block_t = 16
        _hc_weights_kernel[(triton.cdiv(t, block_t),)](
            mixes, scale.float().contiguous(), base.float().contiguous(), pre, post, comb, t,
            eps, N=n, ITERS=iterations, BLOCK=next_pow2(n), BLOCK_T=block_t, num_warps=1,
            **pdl_args(),
        )  # fmt: skip
    return pre, post, comb


@triton.jit
def _hc_head_kernel(
    mix_ptr,
    scale_ptr,
    base_ptr,
    out_ptr,
    eps,
    N: tl.constexpr,
    BLOCK: tl.constexpr,
    PDL: tl.constexpr,
):
    pdl_enter(PDL)
    t = tl.program_id(0).to(tl.int64)
    i = tl.arange(0, BLOCK)
    valid = i < N
    m = tl.load(mix_ptr + t * N + i, mask=valid, other=0.0)
    y = m * tl.load(scale_ptr) + tl.load(base_ptr + i, mask=valid, other=0.0)
    tl.store(out_ptr + t * N + i, tl.sigmoid(y) + eps, mask=valid)


def hc_head_weights(
    mixes: torch.Tensor, scale: torch.Tensor, base: torch.Tensor, eps: float
) -> torch.Tensor:
    """The final collapse's weights [T, n] float32 from `mixes` [T, n] float32, `scale` [1]
    and `base` [n]."""
    t, n = mixes.shape
    assert mixes.dtype == torch.float32 and mixes.is_contiguous() and base.shape == (n,)
    out = torch.empty_like(mixes)
    if t:
        _hc_head_kernel[(t,)](
            mixes, scale.float().contiguous(), base.float().contiguous(), out, eps, N=n,
            BLOCK=next_pow2(n), num_warps=1, **pdl_args(),
        )  # fmt: skip
    return out
