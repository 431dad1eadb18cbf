# mypy: disable-error-code="untyped-decorator,no-untyped-def"
"""Dynamic FP8 activation quantization: `x` [M, K] -> e4m3 `q` [M, K] and float32 scales
[M, cdiv(K, group)], one per row and group of `group` columns (`group = K`: per token, the
compressed-tensors scheme; 128: block FP8's). `scale = amax / 448`, `q = x / scale` rounded
to nearest (saturating), as `resin_model.quant.quantize_fp8_activations` computes.

One program per (row, group), two passes over the group (amax, then quantize; the second
reads from cache). No host sync; graph-safe. For the FP8 matmuls whose activation groups are
their K tile, `fp8_gemm` quantizes inside the matmul instead and skips this launch.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from resin_models_cuda.kernels.pdl import pdl_args, pdl_enter
from resin_models_cuda.kernels.quant_tiles import FP8_MAX, to_fp8


@triton.jit
def _quant_rows_kernel(
    x_ptr,  # [M, K], row stride stride_x, last dim contiguous
    q_ptr,  # float8e4nv [M, K], row stride stride_q
    s_ptr,  # float32 [M, G] contiguous
    K,
    G,
    GROUP,
    stride_x,
    stride_q,
    BLOCK: tl.constexpr,
    PDL: tl.constexpr,
):
    pdl_enter(PDL)
    row = tl.program_id(0).to(tl.int64)
    g = tl.program_id(1)
    start = g * GROUP
    end = tl.minimum(start + GROUP, K)
    amax = tl.zeros([BLOCK], tl.float32)
    for k0 in range(start, end, BLOCK):
        k = k0 + tl.arange(0, BLOCK)
        x = tl.load(x_ptr + row * stride_x + k, mask=k < end, other=0.0).to(tl.float32)
        amax = tl.maximum(amax, tl.abs(x))
    scale = tl.maximum(tl.max(amax, 0) / FP8_MAX, 1e-12)
    tl.store(s_ptr + row * G + g, scale)
    for k0 in range(start, end, BLOCK):
        k = k0 + tl.arange(0, BLOCK)
        x = tl.load(x_ptr + row * stride_x + k, mask=k < end, other=0.0).to(tl.float32)
        tl.store(q_ptr + row * stride_q + k, to_fp8(x / scale), mask=k < end)


def quantize_fp8_rows(
    x: torch.Tensor,
    group: int | None = None,
    *,
    out: torch.Tensor | None = None,
    scale: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """`x` [M, K] (float) -> (`q` float8_e4m3fn [M, K], `scale` float32 [M, cdiv(K, group)]);
    `group=None`: one scale per row."""
    assert x.dim() == 2 and x.stride(1) == 1 and x.is_floating_point()
    m, k = x.shape
    group = k if group is None else group
    assert group > 0
    groups = triton.cdiv(k, group)
    if out is None:
        out = torch.empty((m, k), dtype=torch.float8_e4m3fn, device=x.device)
    if scale is None:
        scale = torch.empty((m, groups), dtype=torch.float32, device=x.device)
    assert out.shape == (m, k) and out.dtype == torch.float8_e4m3fn and out.stride(1) == 1
    assert scale.shape == (m, groups) and scale.dtype == torch.float32 and scale.is_contiguous()
    if m and k:
        block = min(triton.next_power_of_2(group), 1024)
        _quant_rows_kernel[(m, groups)](
            x, out, scale, k, groups, group, x.stride(0), out.stride(0), BLOCK=block,
            num_warps=4 if block >= 512 else 1, **pdl_args(),
        )  # fmt: skip
    return out, scale
