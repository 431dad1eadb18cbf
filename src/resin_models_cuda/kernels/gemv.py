# mypy: disable-error-code="untyped-decorator,no-untyped-def"
"""Skinny matmul for decode at tiny batch: `y = x @ W.T (+ b)` with x [M, K], M <= 4.

At M = 1..4 the product is pure weight streaming. Each program owns `BLOCK_N` output
features and walks K in `BLOCK_K` chunks, keeping `BLOCK_N x BLOCK_K` fp32 partial products
per row of x and reducing once at the end, so every weight byte is loaded exactly once with
wide contiguous loads; the grid covers N only (no split-K, so no second pass or atomics).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _gemv_kernel(
    x_ptr,  # [M, K], row stride stride_x
    w_ptr,  # [N, K] contiguous rows, row stride stride_w
    b_ptr,  # [N] (read when HAS_BIAS)
    y_ptr,  # [M, N] contiguous
    N,
    K,
    stride_x,
    stride_w,
    M: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    pid = tl.program_id(0)
    n = pid * BLOCK_N + tl.arange(0, BLOCK_N)
    nmask = n < N
    kk = tl.arange(0, BLOCK_K)
    acc0 = tl.zeros([BLOCK_N, BLOCK_K], tl.float32)
    acc1 = tl.zeros([BLOCK_N, BLOCK_K], tl.float32)
    acc2 = tl.zeros([BLOCK_N, BLOCK_K], tl.float32)
    acc3 = tl.zeros([BLOCK_N, BLOCK_K], tl.float32)
    w_rows = w_ptr + n.to(tl.int64)[:, None] * stride_w
    for k0 in range(0, K, BLOCK_K):
        k = k0 + kk
        kmask = k < K
        w = tl.load(w_rows + k[None, :], mask=nmask[:, None] & kmask[None, :], other=0.0)
        w = w.to(tl.float32)
        x0 = tl.load(x_ptr + k, mask=kmask, other=0.0).to(tl.float32)
        acc0 += w * x0[None, :]
        if M > 1:
            x1 = tl.load(x_ptr + stride_x + k, mask=kmask, other=0.0).to(tl.float32)
            acc1 += w * x1[None, :]
        if M > 2:
            x2 = tl.load(x_ptr + 2 * stride_x + k, mask=kmask, other=0.0).to(tl.float32)
            acc2 += w * x2[None, :]
        if M > 3:
            x3 = tl.load(x_ptr + 3 * stride_x + k, mask=kmask, other=0.0).to(tl.float32)
            acc3 += w * x3[None, :]
    bias = tl.zeros([BLOCK_N], tl.float32)
    if HAS_BIAS:
        bias = tl.load(b_ptr + n, mask=nmask, other=0.0).to(tl.float32)
    out_ty = y_ptr.dtype.element_ty
    tl.store(y_ptr + n, (tl.sum(acc0, 1) + bias).to(out_ty), mask=nmask)
    if M > 1:
        tl.store(y_ptr + N + n, (tl.sum(acc1, 1) + bias).to(out_ty), mask=nmask)
    if M > 2:
        tl.store(y_ptr + 2 * N + n, (tl.sum(acc2, 1) + bias).to(out_ty), mask=nmask)
    if M > 3:
        tl.store(y_ptr + 3 * N + n, (tl.sum(acc3, 1) + bias).to(out_ty), mask=nmask)


MAX_ROWS = 4


def gemv(
    x: torch.Tensor,
    w: torch.Tensor,
    bias: torch.Tensor | None = None,
    *,
    block_n: int = 8,
    block_k: int = 512,
    num_warps: int = 4,
    out_dtype: torch.dtype | None = None,
) -> torch.Tensor:
    """`x @ w.T + bias` for x [M, K] with M <= 4, w [N, K] (last dim contiguous)."""
    m, k = x.shape
    n = w.shape[0]
    assert 1 <= m <= MAX_ROWS and w.shape[1] == k and w.stride(1) == 1 and x.stride(1) == 1
    y = torch.empty((m, n), dtype=out_dtype or x.dtype, device=x.device)
    _gemv_kernel[(triton.cdiv(n, block_n),)](
        x, w, w if bias is None else bias, y, n, k, x.stride(0), w.stride(0),
        M=m, HAS_BIAS=bias is not None, BLOCK_N=block_n, BLOCK_K=block_k, num_warps=num_warps,
    )  # fmt: skip
    return y
