# mypy: disable-error-code="untyped-decorator,no-untyped-def"
"""DeepSeek-V4's compressor: one entry pools the `S` slots of its window with a per-channel
softmax, `out[e, c] = sum_s softmax_s(gate[e, s, c] + bias[s, c]) * kv[e, s, c]`. The softmax
runs in float32 and its weights are rounded to the storage dtype before the weighted sum (as
transformers does); a slot whose gate is -inf (CSA's first entry has no previous block) weighs
0. One program pools one entry over a block of channels, every slot at once (S <= 256: HCA's
128 tokens, CSA's 2 x 4). The entry's `kv_norm` and rotary follow as plain ops."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from resin_models_cuda.kernels.paged import next_pow2


@triton.jit
def _pool_kernel(
    kv_ptr,  # [E, S, C]
    gate_ptr,  # [E, S, C] float32
    bias_ptr,  # [S, C] float32
    out_ptr,  # [E, C]
    S: tl.constexpr,
    C: tl.constexpr,
    BLOCK_S: tl.constexpr,
    BLOCK_C: tl.constexpr,
):
    e = tl.program_id(0).to(tl.int64)
    c = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
    s = tl.arange(0, BLOCK_S)
    mask = (s[:, None] < S) & (c[None, :] < C)
    at = (e * S + s[:, None]) * C + c[None, :]
    gate = tl.load(gate_ptr + at, mask=mask, other=float("-inf"))
    gate += tl.load(bias_ptr + s[:, None] * C + c[None, :], mask=mask, other=0.0)
    gate = tl.where(mask, gate, float("-inf"))
    top = tl.max(gate, 0)
    top = tl.where(c < C, top, 0.0)  # a padding channel has no finite gate
    e_ = tl.where(mask, tl.exp(gate - top[None, :]), 0.0)
    total = tl.maximum(tl.sum(e_, 0), 1e-30)  # >= 1 on a real channel
    dtype = out_ptr.dtype.element_ty
    weights = (e_ / total[None, :]).to(dtype).to(tl.float32)
    kv = tl.load(kv_ptr + at, mask=mask, other=0.0).to(tl.float32)
    pooled = tl.sum(tl.where(mask, weights * kv, 0.0), 0)
    tl.store(out_ptr + e * C + c, pooled.to(dtype), mask=c < C)


def gated_pool(kv: torch.Tensor, gate: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """[E, C] in kv's dtype: each entry's slots `kv` [E, S, C] pooled with the softmax over
    slots of `gate` [E, S, C] (float32, -inf for an empty slot) plus `bias` [S, C]."""
    entries, slots, channels = kv.shape
    assert gate.shape == kv.shape and bias.shape == (slots, channels)
    out = torch.empty((entries, channels), dtype=kv.dtype, device=kv.device)
    if entries:
        block_c = min(64, next_pow2(channels))
        grid = (entries, triton.cdiv(channels, block_c))
        _pool_kernel[grid](
            kv.contiguous(), gate.float().contiguous(), bias.float().contiguous(), out,
            S=slots, C=channels, BLOCK_S=next_pow2(slots), BLOCK_C=block_c,
        )  # fmt: skip
    return out
