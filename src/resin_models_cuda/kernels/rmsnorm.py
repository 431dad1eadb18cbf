# mypy: disable-error-code="untyped-decorator,no-untyped-def"
"""RMSNorm, alone or fused with the residual add that precedes it.

`fused_add_rmsnorm(x, residual, w)`: `residual += x` then `x = rmsnorm(residual) * w`, both in
place, one read and one write of each row (the pattern between every two sublayers).
Statistics are computed in float32 whatever the storage dtype.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from resin_models_cuda.kernels.paged import next_pow2


@triton.jit
def _rmsnorm_kernel(
    x_ptr,  # [N, H], row stride stride_x, in place unless out_ptr differs
    res_ptr,  # [N, H], row stride stride_r (read and written when HAS_RESIDUAL)
    w_ptr,  # [H]
    out_ptr,  # [N, H], row stride stride_o
    stride_x,
    stride_r,
    stride_o,
    eps,
    H: tl.constexpr,
    BLOCK: tl.constexpr,
    HAS_RESIDUAL: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < H
    x = tl.load(x_ptr + row * stride_x + cols, mask=mask, other=0.0).to(tl.float32)
    if HAS_RESIDUAL:
        x += tl.load(res_ptr + row * stride_r + cols, mask=mask, other=0.0).to(tl.float32)
        tl.store(res_ptr + row * stride_r + cols, x.to(res_ptr.dtype.element_ty), mask=mask)
        # Normalize what was stored, so the result matches an unfused add in that dtype.
        x = tl.load(res_ptr + row * stride_r + cols, mask=mask, other=0.0).to(tl.float32)
    var = tl.sum(x * x, 0) / H
    w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    y = x * tl.rsqrt(var + eps)
    # Round to the storage dtype before the weight, as Hugging Face's Llama RMSNorm does.
    y = y.to(out_ptr.dtype.element_ty).to(tl.float32) * w
    tl.store(out_ptr + row * stride_o + cols, y.to(out_ptr.dtype.element_ty), mask=mask)


def _check(x: torch.Tensor, weight: torch.Tensor) -> None:
    assert x.dim() == 2 and x.stride(1) == 1, "x must be [N, H] with contiguous rows"
    assert weight.shape == (x.shape[1],) and weight.is_contiguous()


def rmsnorm(
    x: torch.Tensor, weight: torch.Tensor, eps: float, out: torch.Tensor | None = None
) -> torch.Tensor:
    """`rmsnorm(x) * weight` row-wise; `x` [N, H]. Returns `out` (new unless given)."""
    _check(x, weight)
    if out is None:
        out = torch.empty_like(x)
    assert out.shape == x.shape and out.stride(1) == 1
    if x.shape[0]:
        _rmsnorm_kernel[(x.shape[0],)](
            x, x, weight, out, x.stride(0), x.stride(0), out.stride(0), eps,
            H=x.shape[1], BLOCK=next_pow2(x.shape[1]), HAS_RESIDUAL=False,
            num_warps=4 if x.shape[1] <= 4096 else 8,
        )  # fmt: skip
    return out


def fused_add_rmsnorm(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
) -> None:
    """In place: `residual += x`, then `x = rmsnorm(residual) * weight`."""
    _check(x, weight)
    assert residual.shape == x.shape and residual.stride(1) == 1
    if x.shape[0]:
        _rmsnorm_kernel[(x.shape[0],)](
            x, residual, weight, x, x.stride(0), residual.stride(0), x.stride(0), eps,
            H=x.shape[1], BLOCK=next_pow2(x.shape[1]), HAS_RESIDUAL=True,
            num_warps=4 if x.shape[1] <= 4096 else 8,
        )  # fmt: skip
