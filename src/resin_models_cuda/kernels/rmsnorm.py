# mypy: disable-error-code="untyped-decorator,no-untyped-def"
"""RMSNorm in its three placements: plain, fused with the residual add before it (pre-norm
models: Llama), and "post-norm then add then pre-norm" (Gemma 3, OLMo 2: the sublayer output is
normed before it joins the residual).

- `rmsnorm(x, w)`: `rmsnorm(x) * w`.
- `fused_add_rmsnorm(x, residual, w)`: in place, `residual += x`, then `x = rmsnorm(residual) * w`.
- `fused_add_rmsnorm(x, residual, w, x_weight=wx)`: in place, `residual += rmsnorm(x) * wx`,
  then `x = rmsnorm(residual) * w` (one read and one write of each row).

`unit_offset` is Gemma's `(1 + w)` weight, applied in float32 before one rounding (as Hugging
Face's Gemma does); otherwise the normed value is rounded to the storage dtype before the
weight multiply (as Llama does). Statistics are float32 whatever the storage dtype.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from resin_models_cuda.kernels.paged import next_pow2
from resin_models_cuda.kernels.pdl import pdl_args, pdl_enter


@triton.jit
def _normed(x, w, eps, H: tl.constexpr, UNIT_OFFSET: tl.constexpr, dtype: tl.constexpr):
    """rmsnorm(x) * w of one float32 row, rounded to `dtype` like the model's norm does."""
    y = x * tl.rsqrt(tl.sum(x * x, 0) / H + eps)
    if UNIT_OFFSET:
        return (y * (1.0 + w)).to(dtype)
    return (y.to(dtype).to(tl.float32) * w).to(dtype)


@triton.jit
def _rmsnorm_kernel(
    x_ptr,  # [N, H], row stride stride_x
    res_ptr,  # [N, H], row stride stride_r (read and written when HAS_RESIDUAL)
    w_ptr,  # [H]
    wx_ptr,  # [H]: norm of x before the add (read when NORM_INPUT)
    out_ptr,  # [N, H], row stride stride_o (may alias x)
    stride_x,
    stride_r,
    stride_o,
    eps,
    H: tl.constexpr,
    BLOCK: tl.constexpr,
    HAS_RESIDUAL: tl.constexpr,
    NORM_INPUT: tl.constexpr,
    UNIT_OFFSET: tl.constexpr,
    PDL: tl.constexpr,
):
    pdl_enter(PDL)
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < H
    dtype = out_ptr.dtype.element_ty
    x = tl.load(x_ptr + row * stride_x + cols, mask=mask, other=0.0).to(tl.float32)
    if HAS_RESIDUAL:
        if NORM_INPUT:
            wx = tl.load(wx_ptr + cols, mask=mask, other=0.0).to(tl.float32)
            x = _normed(x, wx, eps, H, UNIT_OFFSET, dtype).to(tl.float32)
        x += tl.load(res_ptr + row * stride_r + cols, mask=mask, other=0.0).to(tl.float32)
        tl.store(res_ptr + row * stride_r + cols, x.to(res_ptr.dtype.element_ty), mask=mask)
        # Normalize what was stored, so the result matches an unfused add in that dtype.
        x = tl.load(res_ptr + row * stride_r + cols, mask=mask, other=0.0).to(tl.float32)
    w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    tl.store(out_ptr + row * stride_o + cols, _normed(x, w, eps, H, UNIT_OFFSET, dtype), mask=mask)


def _check(x: torch.Tensor, weight: torch.Tensor) -> None:
    assert x.dim() == 2 and x.stride(1) == 1, "x must be [N, H] with contiguous rows"
    assert weight.shape == (x.shape[1],) and weight.is_contiguous()


def rmsnorm(
    x: torch.Tensor,
    weight: torch.Tensor,
    eps: float,
    out: torch.Tensor | None = None,
    unit_offset: bool = False,
) -> torch.Tensor:
    """`rmsnorm(x) * weight` row-wise; `x` [N, H]. Returns `out` (new unless given)."""
    _check(x, weight)
    if out is None:
        out = torch.empty((x.shape[0], x.shape[1]), dtype=x.dtype, device=x.device)
    assert out.shape == x.shape and out.stride(1) == 1
    if x.shape[0]:
        _rmsnorm_kernel[(x.shape[0],)](
            x, x, weight, weight, out, x.stride(0), x.stride(0), out.stride(0), eps,
            H=x.shape[1], BLOCK=next_pow2(x.shape[1]), HAS_RESIDUAL=False, NORM_INPUT=False,
            UNIT_OFFSET=unit_offset, num_warps=4 if x.shape[1] <= 4096 else 8, **pdl_args(),
        )  # fmt: skip
    return out


def fused_add_rmsnorm(
    x: torch.Tensor,
    residual: torch.Tensor,
    weight: torch.Tensor,
    eps: float,
    x_weight: torch.Tensor | None = None,
    unit_offset: bool = False,
) -> None:
    """In place: `residual += x` (or `+= rmsnorm(x) * x_weight`), then
    `x = rmsnorm(residual) * weight`."""
    _check(x, weight)
    assert residual.shape == x.shape and residual.stride(1) == 1
    if x_weight is not None:
        _check(x, x_weight)
    if x.shape[0]:
        _rmsnorm_kernel[(x.shape[0],)](
            x, residual, weight, weight if x_weight is None else x_weight, x,
            x.stride(0), residual.stride(0), x.stride(0), eps,
            H=x.shape[1], BLOCK=next_pow2(x.shape[1]), HAS_RESIDUAL=True,
            NORM_INPUT=x_weight is not None, UNIT_OFFSET=unit_offset,
            num_warps=4 if x.shape[1] <= 4096 else 8, **pdl_args(),
        )  # fmt: skip
