# mypy: disable-error-code="untyped-decorator,no-untyped-def"
"""Gated RMSNorm of Gated DeltaNet's output, per value head:
`out = (w * rmsnorm(x)) * silu(z)`, the statistics in float32, `rmsnorm(x)` rounded to the
storage dtype before the weight multiply and the product rounded once (as transformers'
Qwen3.5 norm does). `sigmoid=True` is KDA's (GLM-5.3): `w * rmsnorm(x) * sigmoid(z)` all in
float32, rounded once at the end."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from resin_models_cuda.kernels.paged import next_pow2
from resin_models_cuda.kernels.pdl import pdl_args, pdl_enter


@triton.jit
def _gated_rmsnorm_kernel(
    x_ptr,  # [T, H, D] contiguous
    z_ptr,  # [T, H * D], row stride stride_z, the rest contiguous
    w_ptr,  # [D]
    out_ptr,  # [T, H * D] contiguous
    stride_z,
    eps,
    H: tl.constexpr,
    D: tl.constexpr,
    BLOCK: tl.constexpr,
    SIGMOID: tl.constexpr,
    PDL: tl.constexpr,
):
    pdl_enter(PDL)
    t = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1)
    cols = tl.arange(0, BLOCK)
    mask = cols < D
    dtype = out_ptr.dtype.element_ty
    x = tl.load(x_ptr + (t * H + h) * D + cols, mask=mask, other=0.0).to(tl.float32)
    z = tl.load(z_ptr + t * stride_z + h * D + cols, mask=mask, other=0.0).to(tl.float32)
    w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    normed = x * tl.rsqrt(tl.sum(x * x, 0) / D + eps)
    if SIGMOID:
        y = w * normed * tl.sigmoid(z)
    else:
        normed = normed.to(dtype).to(tl.float32)
        y = (w * normed).to(dtype).to(tl.float32) * (z * tl.sigmoid(z))
    tl.store(out_ptr + (t * H + h) * D + cols, y.to(dtype), mask=mask)


def gated_rmsnorm(
    x: torch.Tensor, z: torch.Tensor, weight: torch.Tensor, eps: float, sigmoid: bool = False
) -> torch.Tensor:
    """[T, H * D]: each head of `x` [T, H, D] normed, times `weight` [D], times silu (or
    sigmoid, `sigmoid`) of its slice of `z` [T, H * D] (rows may be strided)."""
    t, heads, dim = x.shape
    assert x.is_contiguous() and weight.shape == (dim,)
    assert z.shape == (t, heads * dim) and z.stride(1) == 1
    out = torch.empty((t, heads * dim), dtype=x.dtype, device=x.device)
    if t:
        _gated_rmsnorm_kernel[(t, heads)](
            x, z, weight, out, z.stride(0), eps, H=heads, D=dim, BLOCK=next_pow2(dim),
            SIGMOID=sigmoid, num_warps=1 if dim <= 256 else 4, **pdl_args(),
        )  # fmt: skip
    return out
