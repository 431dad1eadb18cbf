# mypy: disable-error-code="untyped-decorator,no-untyped-def"
"""SiLU-and-mul: `out = silu(x[:, :I]) * x[:, I:]` for the gated MLP (gate and up fused)."""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _silu_mul_kernel(
    x_ptr,  # [N, 2I], row stride stride_x, last dim contiguous
    out_ptr,  # [N, I], row stride stride_o, last dim contiguous
    stride_x,
    stride_o,
    INTER: tl.constexpr,
    BLOCK: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < INTER
    gate = tl.load(x_ptr + row * stride_x + cols, mask=mask, other=0.0).to(tl.float32)
    up = tl.load(x_ptr + row * stride_x + INTER + cols, mask=mask, other=0.0).to(tl.float32)
    # Round the activation to the storage dtype first, as the unfused PyTorch code does.
    act = (gate * tl.sigmoid(gate)).to(out_ptr.dtype.element_ty).to(tl.float32)
    tl.store(out_ptr + row * stride_o + cols, (act * up).to(out_ptr.dtype.element_ty), mask=mask)


def silu_and_mul(x: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """`x` [N, 2I] -> [N, I]."""
    assert x.dim() == 2 and x.stride(1) == 1 and x.shape[1] % 2 == 0
    inter = x.shape[1] // 2
    if out is None:
        out = torch.empty((x.shape[0], inter), dtype=x.dtype, device=x.device)
    assert out.shape == (x.shape[0], inter) and out.stride(1) == 1
    block = 1024
    if x.shape[0]:
        _silu_mul_kernel[(x.shape[0], triton.cdiv(inter, block))](
            x, out, x.stride(0), out.stride(0), INTER=inter, BLOCK=block, num_warps=4
        )
    return out
