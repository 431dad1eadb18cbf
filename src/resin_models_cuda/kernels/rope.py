# mypy: disable-error-code="untyped-decorator,no-untyped-def"
"""Rotary position embedding (rotate-half / GPT-NeoX layout, as Llama and Qwen use), in place.

`rope_cache` builds float32 `cos`/`sin` tables `[max_positions, rotary_dim // 2]` once (any
`RopeConfig` of the shared model config; `rotary_dim` is the head dim, or less for partial
rotary: GLM-4.5 turns the leading half of each head and passes the rest); `apply_rope`
rotates the query and key heads of every token at its own position in one launch (the norm
of the whole head fused in when asked), and with `append` also writes the
rotated K and the V of each token into its paged-cache slot (the KV append fused in: one
launch fewer per layer; a negative slot, CUDA-graph padding, writes nothing). The kernel's
Triton `launch_metadata` (`rope_bytes`) counts the table rows and cache slots it touches, not
the whole tables and arena it is handed (`resin bench runner --kernels`, proton).
"""

from __future__ import annotations

from typing import Any

import torch
import triton
import triton.language as tl

from resin_model.config import RopeConfig
from resin_models_cuda.kernels.paged import check_cache, next_pow2
from resin_models_cuda.kernels.pdl import pdl_args, pdl_enter


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
def _norm_rope_heads(
    ptr, stride_t, stride_h, t, w_ptr, c, s, eps,
    NUM: tl.constexpr, PAD: tl.constexpr, HALF: tl.constexpr, PASS: tl.constexpr,
    PASS_PAD: tl.constexpr, HAS_NORM: tl.constexpr, UNIT_OFFSET: tl.constexpr,
):  # fmt: skip
    """Heads [NUM, 2 * HALF + PASS] of token t: optional per-head RMS norm over the whole head
    (rounded to the storage dtype, as the unfused norm does), then the half-split rotation of
    the leading 2 * HALF dims, in place; the trailing PASS dims (partial rotary) are only
    normed. Returns the two rotated halves and the passed part (as stored; the first half
    stands in for the last when PASS is 0)."""
    dtype = ptr.dtype.element_ty
    j = tl.arange(0, HALF)
    h = tl.arange(0, PAD)[:, None]
    p = ptr + t * stride_t + h * stride_h + j[None, :]
    m = h < NUM
    x1 = tl.load(p, mask=m, other=0.0).to(tl.float32)
    x2 = tl.load(p + HALF, mask=m, other=0.0).to(tl.float32)
    if PASS > 0:
        jp = tl.arange(0, PASS_PAD)[None, :]
        pp = ptr + t * stride_t + h * stride_h + 2 * HALF + jp
        mp = m & (jp < PASS)
        x3 = tl.load(pp, mask=mp, other=0.0).to(tl.float32)
    if HAS_NORM:
        squares = tl.sum(x1 * x1, 1) + tl.sum(x2 * x2, 1)
        if PASS > 0:
            squares += tl.sum(x3 * x3, 1)
        r = tl.rsqrt(squares / (2 * HALF + PASS) + eps)[:, None]
        w1 = tl.load(w_ptr + j).to(tl.float32)[None, :]
        w2 = tl.load(w_ptr + HALF + j).to(tl.float32)[None, :]
        if UNIT_OFFSET:
            x1 = (x1 * r * (1.0 + w1)).to(dtype).to(tl.float32)
            x2 = (x2 * r * (1.0 + w2)).to(dtype).to(tl.float32)
        else:
            x1 = ((x1 * r).to(dtype).to(tl.float32) * w1).to(dtype).to(tl.float32)
            x2 = ((x2 * r).to(dtype).to(tl.float32) * w2).to(dtype).to(tl.float32)
        if PASS > 0:
            w3 = tl.load(w_ptr + 2 * HALF + jp, mask=jp < PASS, other=0.0).to(tl.float32)
            if UNIT_OFFSET:
                x3 = (x3 * r * (1.0 + w3)).to(dtype).to(tl.float32)
            else:
                x3 = ((x3 * r).to(dtype).to(tl.float32) * w3).to(dtype).to(tl.float32)
            tl.store(pp, x3.to(dtype), mask=mp)
    y1 = (x1 * c - x2 * s).to(dtype)
    y2 = (x2 * c + x1 * s).to(dtype)
    tl.store(p, y1, mask=m)
    tl.store(p + HALF, y2, mask=m)
    if PASS > 0:  # noqa: SIM108 (a static branch: x3 exists only when PASS > 0)
        y3 = x3.to(dtype)
    else:
        y3 = y1
    return y1, y2, y3


def rope_bytes(grid: Any, metadata: Any, args: dict[str, Any]) -> dict[str, int]:
    """Triton's `launch_metadata` hook, `(grid, metadata, {argument: value}) -> {"bytes": n}`:
    q and k read and written in place, T positions and their cos / sin rows, the norm weights
    (HAS_NORM), and with HAS_APPEND v read, the slots, and T tokens of K and V written."""
    q, k, pos = args["q_ptr"], args["k_ptr"], args["pos_ptr"]
    tokens = q.shape[0]
    moved = 2 * (q.numel() + k.numel()) * q.element_size() + tokens * pos.element_size()
    moved += 2 * tokens * args["cos_ptr"].shape[1] * args["cos_ptr"].element_size()
    if args.get("HAS_NORM"):
        moved += sum(args[w].numel() * args[w].element_size() for w in ("qw_ptr", "kw_ptr"))
    if args.get("HAS_APPEND"):
        v, cache = args["v_ptr"], args["k_cache_ptr"]
        moved += v.numel() * v.element_size() + tokens * args["slots_ptr"].element_size()
        moved += 2 * k.numel() * cache.element_size()
    return {"bytes": moved}


@triton.jit(launch_metadata=rope_bytes)
def _rope_kernel(
    q_ptr,  # [T, Hq, D], strides (stride_qt, stride_qh, 1)
    k_ptr,  # [T, Hk, D], strides (stride_kt, stride_kh, 1)
    pos_ptr,  # int32 [T]
    cos_ptr,  # fp32 [max_positions, HALF] contiguous (2 * HALF = rotated dims <= D)
    sin_ptr,  # fp32 [max_positions, HALF] contiguous
    qw_ptr,  # [D]: q norm weight (read when HAS_NORM)
    kw_ptr,  # [D]: k norm weight (read when HAS_NORM)
    v_ptr,  # [T, Hk, D], strides (stride_vt, stride_vh, 1) (HAS_APPEND)
    k_cache_ptr,  # [pages, PAGE, Hk, D], strides (stride_cp, stride_ct, stride_ch, 1)
    v_cache_ptr,  # same layout and strides as k_cache
    slots_ptr,  # int32 or int64 [T]: cache slot of each token (< 0: none)
    stride_qt,
    stride_qh,
    stride_kt,
    stride_kh,
    stride_vt,
    stride_vh,
    stride_cp,
    stride_ct,
    stride_ch,
    eps,
    NUM_Q: tl.constexpr,
    NUM_K: tl.constexpr,
    Q_PAD: tl.constexpr,
    K_PAD: tl.constexpr,
    HALF: tl.constexpr,
    PASS: tl.constexpr,  # D - 2 * HALF: trailing dims rotary leaves alone
    PASS_PAD: tl.constexpr,
    HAS_NORM: tl.constexpr,
    UNIT_OFFSET: tl.constexpr,
    HAS_APPEND: tl.constexpr,
    PAGE: tl.constexpr,
    PDL: tl.constexpr,
):
    pdl_enter(PDL)
    t = tl.program_id(0).to(tl.int64)
    pos = tl.load(pos_ptr + t).to(tl.int64)
    j = tl.arange(0, HALF)
    c = tl.load(cos_ptr + pos * HALF + j)[None, :]
    s = tl.load(sin_ptr + pos * HALF + j)[None, :]
    _norm_rope_heads(q_ptr, stride_qt, stride_qh, t, qw_ptr, c, s, eps, NUM_Q, Q_PAD, HALF,
                     PASS, PASS_PAD, HAS_NORM, UNIT_OFFSET)  # fmt: skip
    k1, k2, k3 = _norm_rope_heads(k_ptr, stride_kt, stride_kh, t, kw_ptr, c, s, eps, NUM_K,
                                  K_PAD, HALF, PASS, PASS_PAD, HAS_NORM, UNIT_OFFSET)  # fmt: skip
    if HAS_APPEND:
        slot = tl.load(slots_ptr + t).to(tl.int64)
        if slot >= 0:
            h = tl.arange(0, K_PAD)[:, None]
            m = h < NUM_K
            dst = (
                (slot // PAGE) * stride_cp + (slot % PAGE) * stride_ct + h * stride_ch + j[None, :]
            )
            dt = k_cache_ptr.dtype.element_ty
            tl.store(k_cache_ptr + dst, k1.to(dt), mask=m)
            tl.store(k_cache_ptr + dst + HALF, k2.to(dt), mask=m)
            src = v_ptr + t * stride_vt + h * stride_vh + j[None, :]
            tl.store(v_cache_ptr + dst, tl.load(src, mask=m).to(dt), mask=m)
            tl.store(v_cache_ptr + dst + HALF, tl.load(src + HALF, mask=m).to(dt), mask=m)
            if PASS > 0:
                jp = tl.arange(0, PASS_PAD)[None, :]
                mp = m & (jp < PASS)
                rest = (slot // PAGE) * stride_cp + (slot % PAGE) * stride_ct + h * stride_ch
                rest += 2 * HALF + jp
                tl.store(k_cache_ptr + rest, k3.to(dt), mask=mp)
                v3 = tl.load(v_ptr + t * stride_vt + h * stride_vh + 2 * HALF + jp, mask=mp)
                tl.store(v_cache_ptr + rest, v3.to(dt), mask=mp)


def apply_rope(
    q: torch.Tensor,
    k: torch.Tensor,
    positions: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    norms: tuple[torch.Tensor, torch.Tensor] | None = None,
    eps: float = 1e-6,
    unit_offset: bool = False,
    append: tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor] | None = None,
) -> None:
    """Rotate `q` [T, Hq, D] and `k` [T, Hk, D] in place at `positions` (int32 [T]): the
    leading `2 * cos.shape[1]` dims of each head (all of them, or fewer for partial rotary,
    whose trailing dims pass unrotated); with
    `norms` = (q weight [D], k weight [D]), RMS-norm every head first (Qwen3 / Gemma q/k norm,
    fused: one read and one write of q and k); with `append` = (v, k_cache, v_cache, slots),
    also store the rotated k and v at `slots` of the paged caches (`kv_append`, fused)."""
    num_tokens, num_q, head_dim = q.shape
    assert k.shape[0] == num_tokens and k.shape[2] == head_dim
    assert q.stride(2) == 1 and k.stride(2) == 1
    half = cos.shape[1]
    assert half == next_pow2(half) and 2 * half <= head_dim
    assert cos.shape == sin.shape and cos.is_contiguous()
    assert cos.dtype == torch.float32 and positions.dtype == torch.int32
    assert positions.shape[0] >= num_tokens
    if norms is not None:
        assert norms[0].shape == (head_dim,) and norms[1].shape == (head_dim,)
    if num_tokens == 0:
        return
    qw, kw = norms if norms is not None else (cos, cos)
    if append is not None:
        v, k_cache, v_cache, slots = append
        check_cache(k_cache, "k_cache")
        assert k_cache.shape == v_cache.shape and k_cache.stride() == v_cache.stride()
        assert v.shape == k.shape and v.stride(2) == 1 and tuple(k_cache.shape[2:]) == k.shape[1:]
        assert slots.dtype in (torch.int32, torch.int64) and slots.shape[0] >= num_tokens
    else:
        v, k_cache, v_cache, slots = k, k.unsqueeze(0), k.unsqueeze(0), positions  # unread
    _rope_kernel[(num_tokens,)](
        q, k, positions, cos, sin, qw, kw, v, k_cache, v_cache, slots,
        q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        eps, NUM_Q=num_q, NUM_K=k.shape[1], Q_PAD=next_pow2(num_q), K_PAD=next_pow2(k.shape[1]),
        HALF=half, PASS=head_dim - 2 * half, PASS_PAD=next_pow2(max(head_dim - 2 * half, 1)),
        HAS_NORM=norms is not None, UNIT_OFFSET=unit_offset,
        HAS_APPEND=append is not None, PAGE=k_cache.shape[1] if append is not None else 1,
        num_warps=4, **pdl_args(),
    )  # fmt: skip
