# mypy: disable-error-code="untyped-decorator,no-untyped-def"
"""Expert GEMV for small-batch MoE: every (token, expert) pair multiplies its own expert's
matrix (plus its bias), read straight from the stacked expert weights (no gather copy, no host
sync, fixed grid: CUDA-graph safe).

`out[p, n] = sum_k x[p // row_div, k] * w[expert[p], n, k]`, optionally scaled by `scale[p]` and
accumulated into `out[row_out[p], n]` with an atomic add (the weighted combine of the top-k
experts, fused). Each pair reads its expert's weights once; at decode batch sizes, where
pairs rarely share an expert, that is the minimum traffic. Larger batches use the grouped GEMM
(`moe_grouped.py`).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _expert_gemv_kernel(
    x_ptr,  # [R, K], row stride stride_x, last dim contiguous
    w_ptr,  # [E, N, K] contiguous
    expert_ptr,  # int32/int64 [P]: expert of each pair
    scale_ptr,  # fp32 [P] (read when ACCUMULATE)
    bias_ptr,  # [E, N] (read when HAS_BIAS)
    out_ptr,  # ACCUMULATE: fp32 [T, N] (pair p adds into row p // TOPK); else [P, N]
    stride_x,
    stride_o,
    N,
    K,
    ROW_DIV: tl.constexpr,  # x row of pair p: p // ROW_DIV
    TOPK: tl.constexpr,
    ACCUMULATE: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    p = tl.program_id(0)
    n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    nmask = n < N
    row = (p // ROW_DIV).to(tl.int64)
    e = tl.load(expert_ptr + p).to(tl.int64)
    w_base = w_ptr + e * N * K
    acc = tl.zeros([BLOCK_N], tl.float32)
    for k0 in range(0, K, BLOCK_K):
        k = k0 + tl.arange(0, BLOCK_K)
        kmask = k < K
        x = tl.load(x_ptr + row * stride_x + k, mask=kmask, other=0.0).to(tl.float32)
        w = tl.load(w_base + n[:, None] * K + k[None, :], mask=nmask[:, None] & kmask[None, :],
                    other=0.0)  # fmt: skip
        acc += tl.sum(w.to(tl.float32) * x[None, :], 1)
    if HAS_BIAS:
        acc += tl.load(bias_ptr + e * N + n, mask=nmask, other=0.0).to(tl.float32)
    if ACCUMULATE:
        s = tl.load(scale_ptr + p)
        tl.atomic_add(out_ptr + (p // TOPK) * stride_o + n, acc * s, mask=nmask)
    else:
        tl.store(out_ptr + p * stride_o + n, acc.to(out_ptr.dtype.element_ty), mask=nmask)


def expert_gemv(
    x: torch.Tensor,
    w: torch.Tensor,
    experts: torch.Tensor,
    *,
    out: torch.Tensor,
    scale: torch.Tensor | None = None,
    topk: int = 1,
    bias: torch.Tensor | None = None,
    row_div: int = 1,
    block_n: int = 16,
    block_k: int = 256,
    num_warps: int = 8,  # H200 sweep (scripts/tune_moe.py --gemv): 8 warps beat 4 by 5-25%
) -> torch.Tensor:
    """Per-pair expert matrix-vector products (see the module docstring).

    With `scale` (fp32 [P]), pair p adds `scale[p] * (W[e_p] @ x[p // row_div])` into the float32
    `out[p // topk]`; without it, `out[p] = W[e_p] @ x[p // row_div]`.
    """
    assert x.dim() == 2 and x.stride(1) == 1 and w.dim() == 3 and w.is_contiguous()
    _, n, k = w.shape
    assert x.shape[1] == k and experts.dim() == 1 and out.stride(1) == 1
    pairs = experts.shape[0]
    if bias is not None:
        assert bias.shape == (w.shape[0], n) and bias.is_contiguous()
    accumulate = scale is not None
    if accumulate:
        assert out.dtype == torch.float32 and out.shape[1] == n
        assert scale is not None and scale.dtype == torch.float32 and scale.shape[0] == pairs
    else:
        assert out.shape == (pairs, n)
    if pairs:
        # Narrow N tiles: a decode step has few pairs, so parallelism must come from N.
        _expert_gemv_kernel[(pairs, triton.cdiv(n, block_n))](
            x, w, experts, scale if accumulate else out, w if bias is None else bias, out,
            x.stride(0), out.stride(0), n, k, ROW_DIV=row_div, TOPK=topk, ACCUMULATE=accumulate,
            HAS_BIAS=bias is not None, BLOCK_N=block_n, BLOCK_K=block_k, num_warps=num_warps,
        )  # fmt: skip
    return out
