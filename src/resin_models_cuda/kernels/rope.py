# mypy: disable-error-code="untyped-decorator,no-untyped-def"
"""Rotary position embedding (rotate-half / GPT-NeoX layout, as Llama and Qwen use), in place.

`rope_cache` builds float32 `cos`/`sin` tables `[max_positions, head_dim // 2]` once (any
`RopeConfig` of the shared model config); `apply_rope` rotates the query and key
heads of every token at its own position in one launch.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from resin_models_cuda.kernels.paged import next_pow2
from resin_models_torch.config import RopeConfig


def rope_cache(
    rope: RopeConfig, head_dim: int, max_positions: int, device: torch.device | str = "cpu"
) -> tuple[torch.Tensor, torch.Tensor]:
    """float32 (cos, sin), each `[max_positions, head_dim // 2]`, from the model config's one
    frequency formula (default, linear, Llama-3, YaRN; YaRN's attention factor scales both)."""
    inv_freq = rope.inv_freq(head_dim).to(torch.float32)
    freqs = torch.outer(torch.arange(max_positions, dtype=torch.float32), inv_freq)
    cos, sin = freqs.cos() * rope.attention_factor, freqs.sin() * rope.attention_factor
    return cos.to(device), sin.to(device)


@triton.jit
def _rope_kernel(
    q_ptr,  # [T, Hq, D], strides (stride_qt, stride_qh, 1)
    k_ptr,  # [T, Hk, D], strides (stride_kt, stride_kh, 1)
    pos_ptr,  # int32 [T]
    cos_ptr,  # fp32 [max_positions, D // 2] contiguous
    sin_ptr,  # fp32 [max_positions, D // 2] contiguous
    stride_qt,
    stride_qh,
    stride_kt,
    stride_kh,
    NUM_Q: tl.constexpr,
    NUM_K: tl.constexpr,
    Q_PAD: tl.constexpr,
    K_PAD: tl.constexpr,
    HALF: tl.constexpr,
):
    t = tl.program_id(0).to(tl.int64)
    pos = tl.load(pos_ptr + t).to(tl.int64)
    j = tl.arange(0, HALF)
    c = tl.load(cos_ptr + pos * HALF + j)[None, :]
    s = tl.load(sin_ptr + pos * HALF + j)[None, :]
    hq = tl.arange(0, Q_PAD)[:, None]
    qp = q_ptr + t * stride_qt + hq * stride_qh + j[None, :]
    qm = hq < NUM_Q
    x1 = tl.load(qp, mask=qm).to(tl.float32)
    x2 = tl.load(qp + HALF, mask=qm).to(tl.float32)
    tl.store(qp, (x1 * c - x2 * s).to(q_ptr.dtype.element_ty), mask=qm)
    tl.store(qp + HALF, (x2 * c + x1 * s).to(q_ptr.dtype.element_ty), mask=qm)
    hk = tl.arange(0, K_PAD)[:, None]
    kp = k_ptr + t * stride_kt + hk * stride_kh + j[None, :]
    km = hk < NUM_K
    y1 = tl.load(kp, mask=km).to(tl.float32)
    y2 = tl.load(kp + HALF, mask=km).to(tl.float32)
    tl.store(kp, (y1 * c - y2 * s).to(k_ptr.dtype.element_ty), mask=km)
    tl.store(kp + HALF, (y2 * c + y1 * s).to(k_ptr.dtype.element_ty), mask=km)


def apply_rope(
    q: torch.Tensor, k: torch.Tensor, positions: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
) -> None:
    """Rotate `q` [T, Hq, D] and `k` [T, Hk, D] in place at `positions` (int32 [T])."""
    num_tokens, num_q, head_dim = q.shape
    assert k.shape[0] == num_tokens and k.shape[2] == head_dim
    assert q.stride(2) == 1 and k.stride(2) == 1
    assert head_dim % 2 == 0 and head_dim // 2 == next_pow2(head_dim // 2)
    assert cos.shape == sin.shape and cos.shape[1] == head_dim // 2 and cos.is_contiguous()
    assert cos.dtype == torch.float32 and positions.dtype == torch.int32
    assert positions.shape[0] >= num_tokens
    if num_tokens == 0:
        return
    _rope_kernel[(num_tokens,)](
        q, k, positions, cos, sin, q.stride(0), q.stride(1), k.stride(0), k.stride(1),
        NUM_Q=num_q, NUM_K=k.shape[1], Q_PAD=next_pow2(num_q), K_PAD=next_pow2(k.shape[1]),
        HALF=head_dim // 2, num_warps=4,
    )  # fmt: skip
