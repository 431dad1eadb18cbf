# mypy: disable-error-code="untyped-decorator,no-untyped-def"
"""Gated activations over a fused `[gate | up]` row: `out = act(x[:, :I]) * x[:, I:]`.

`act`: "silu" (Llama, Qwen), "gelu_tanh" (Gemma), "swiglu_clamp" (gpt-oss:
`(clamp(up, -l, l) + 1) * g * sigmoid(alpha * g)` with `g = min(gate, l)`), or "silu_clamp"
(DeepSeek-V4, GLM-5.3: `silu(min(gate, l)) * clamp(up, -l, l)`).
"""

from __future__ import annotations

from typing import Literal

import torch
import triton
import triton.language as tl

from resin_models_cuda.kernels.pdl import pdl_args, pdl_enter

Activation = Literal["silu", "gelu_tanh", "swiglu_clamp", "silu_clamp"]
ACTIVATION_CODES = {"silu": 0, "gelu_tanh": 1, "swiglu_clamp": 2, "silu_clamp": 3}


@triton.jit
def gated(gate, up, alpha, limit, ACT: tl.constexpr, dtype: tl.constexpr):
    """act(gate) * up of float32 values read from `dtype` storage (0 silu, 1 gelu_tanh,
    2 swiglu_clamp, 3 silu_clamp), rounded as the unfused PyTorch code rounds; float32
    result."""
    if ACT == 2:
        gate = tl.minimum(gate, limit)
        up = tl.minimum(tl.maximum(up, -limit), limit)
        return (up + 1.0) * (gate * tl.sigmoid(gate * alpha))
    if ACT == 3:
        gate = tl.minimum(gate, limit)
        up = tl.minimum(tl.maximum(up, -limit), limit)
    if ACT == 1:  # 0.5 * (1 + tanh(z)) == sigmoid(2z)
        z = 0.7978845608028654 * (gate + 0.044715 * gate * gate * gate)
        act = gate * tl.sigmoid(2.0 * z)
    else:
        act = gate * tl.sigmoid(gate)
    # Round the activation to the storage dtype first, as the unfused PyTorch code does.
    return act.to(dtype).to(tl.float32) * up


@triton.jit
def _gated_kernel(
    x_ptr,  # [N, 2I], row stride stride_x, last dim contiguous
    out_ptr,  # [N, I], row stride stride_o, last dim contiguous
    stride_x,
    stride_o,
    alpha,
    limit,
    INTER: tl.constexpr,
    BLOCK: tl.constexpr,
    ACT: tl.constexpr,  # ACTIVATION_CODES
    PDL: tl.constexpr,
):
    pdl_enter(PDL)
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < INTER
    dtype = out_ptr.dtype.element_ty
    gate = tl.load(x_ptr + row * stride_x + cols, mask=mask, other=0.0).to(tl.float32)
    up = tl.load(x_ptr + row * stride_x + INTER + cols, mask=mask, other=0.0).to(tl.float32)
    out = gated(gate, up, alpha, limit, ACT, dtype)
    tl.store(out_ptr + row * stride_o + cols, out.to(dtype), mask=mask)


def gated_activation(
    x: torch.Tensor,
    act: Activation = "silu",
    out: torch.Tensor | None = None,
    alpha: float = 1.702,
    limit: float = 7.0,
) -> torch.Tensor:
    """`x` [N, 2I] -> [N, I]."""
    assert x.dim() == 2 and x.stride(1) == 1 and x.shape[1] % 2 == 0
    inter = x.shape[1] // 2
    if out is None:
        out = torch.empty((x.shape[0], inter), dtype=x.dtype, device=x.device)
    assert out.shape == (x.shape[0], inter) and out.stride(1) == 1
    block = 1024
    if x.shape[0]:
        _gated_kernel[(x.shape[0], triton.cdiv(inter, block))](
            x, out, x.stride(0), out.stride(0), alpha, limit,
            INTER=inter, BLOCK=block, ACT=ACTIVATION_CODES[act], num_warps=4, **pdl_args(),
        )  # fmt: skip
    return out


def silu_and_mul(x: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """`x` [N, 2I] -> silu(gate) * up, [N, I]."""
    return gated_activation(x, "silu", out)
