# mypy: disable-error-code="untyped-decorator,no-untyped-def"
"""Expert GEMV for small-batch MoE: every (token, expert) pair reads its own expert's
matrices straight from the stacked expert weights (no gather copy, no host sync, fixed grid:
CUDA-graph safe).

- `expert_gate_up`: `act[p] = gated(W_gu[e_p] @ x[p // row_div] + b)`, the gate and up rows of
  one output tile read by one program and the activation applied before the store (no
  `[P, 2I]` intermediate, no activation launch).
- `expert_down`: `out[t] = sum_j s[t, j] * (W_d[e_tj] @ act[t * k + j] + b)`, one program per
  (pair, output tile) adding its weighted rows into a zeroed float32 buffer (atomics), then
  one cast to the output dtype: per-pair programs keep a batch-1 step's few pairs spread over
  the whole GPU.

At decode batch sizes pairs rarely share an expert, so each pair reading its expert once is
the minimum traffic; larger batches use the grouped GEMM (`moe_grouped.py`). Programs keep a
2-D float32 accumulator and reduce it once after the K loop. The tile shape (`GemvTiles`)
depends on the layer's shape: `tiles_for` reads `TUNED`, the H200's best from
`resin bench tune-moe --graph`.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import triton
import triton.language as tl

from resin_models_cuda.kernels.activation import ACTIVATION_CODES, Activation, gated


class GemvTiles(NamedTuple):
    """Launch shape of one expert-GEMV kernel (tuned by `resin bench tune-moe --graph`)."""

    block_n: int
    block_k: int
    num_warps: int
    num_stages: int = 1


@triton.jit
def _dot_rows(x_ptr, w_ptr, n, nmask, K, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """float32 `W[n, :] @ x` for a tile of rows `n` of a row-major [N, K] matrix."""
    acc = tl.zeros([BLOCK_N, BLOCK_K], tl.float32)
    for k0 in range(0, K, BLOCK_K):
        k = k0 + tl.arange(0, BLOCK_K)
        kmask = k < K
        x = tl.load(x_ptr + k, mask=kmask, other=0.0).to(tl.float32)
        w = tl.load(w_ptr + n[:, None] * K + k[None, :], mask=nmask[:, None] & kmask[None, :],
                    other=0.0)  # fmt: skip
        acc += w.to(tl.float32) * x[None, :]
    return tl.sum(acc, 1)


@triton.jit
def _gate_up_kernel(
    x_ptr,  # [R, K], row stride stride_x, last dim contiguous
    w_ptr,  # [E, 2I, K] contiguous: gate rows, then up rows
    expert_ptr,  # int32/int64 [P]: expert of each pair
    bias_ptr,  # [E, 2I] (read when HAS_BIAS)
    out_ptr,  # [P, I], row stride stride_o
    stride_x,
    stride_o,
    INTER,
    K,
    alpha,
    limit,
    ROW_DIV: tl.constexpr,  # x row of pair p: p // ROW_DIV
    ACT: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    p = tl.program_id(0)
    n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    nmask = n < INTER
    e = tl.load(expert_ptr + p).to(tl.int64)
    x_row = x_ptr + (p // ROW_DIV).to(tl.int64) * stride_x
    w_gate = w_ptr + e * 2 * INTER * K
    gate = _dot_rows(x_row, w_gate, n, nmask, K, BLOCK_N, BLOCK_K)
    up = _dot_rows(x_row, w_gate + INTER * K, n, nmask, K, BLOCK_N, BLOCK_K)
    if HAS_BIAS:
        gate += tl.load(bias_ptr + e * 2 * INTER + n, mask=nmask, other=0.0).to(tl.float32)
        up += tl.load(bias_ptr + e * 2 * INTER + INTER + n, mask=nmask, other=0.0).to(tl.float32)
    dtype = out_ptr.dtype.element_ty
    # Round gate and up to the storage dtype first, as the unfused [P, 2I] store did.
    out = gated(gate.to(dtype).to(tl.float32), up.to(dtype).to(tl.float32), alpha, limit, ACT,
                dtype)  # fmt: skip
    tl.store(out_ptr + p.to(tl.int64) * stride_o + n, out.to(dtype), mask=nmask)


@triton.jit
def _down_kernel(
    act_ptr,  # [T * TOPK, K], row stride stride_a: pair rows, token-major
    w_ptr,  # [E, N, K] contiguous
    expert_ptr,  # int32/int64 [T * TOPK]
    scale_ptr,  # fp32 [T * TOPK]: routing weights
    bias_ptr,  # [E, N] (read when HAS_BIAS)
    out_ptr,  # fp32 [T, N], row stride stride_o, zeroed: pair p adds into row p // TOPK
    stride_a,
    stride_o,
    N,
    K,
    TOPK: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    p = tl.program_id(0).to(tl.int64)
    n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    nmask = n < N
    e = tl.load(expert_ptr + p).to(tl.int64)
    y = _dot_rows(act_ptr + p * stride_a, w_ptr + e * N * K, n, nmask, K, BLOCK_N, BLOCK_K)
    if HAS_BIAS:
        y += tl.load(bias_ptr + e * N + n, mask=nmask, other=0.0).to(tl.float32)
    tl.atomic_add(out_ptr + (p // TOPK) * stride_o + n, tl.load(scale_ptr + p) * y, mask=nmask)


def expert_gate_up(
    x: torch.Tensor,
    w: torch.Tensor,
    experts: torch.Tensor,
    *,
    act: Activation = "silu",
    bias: torch.Tensor | None = None,
    row_div: int = 1,
    alpha: float = 1.702,
    limit: float = 7.0,
    out: torch.Tensor | None = None,
    tiles: GemvTiles | None = None,
) -> torch.Tensor:
    """`x` [R, H], `w` [E, 2I, H], `experts` [P] -> activated `[P, I]` (pair p reads row
    `p // row_div` of `x`); `tiles` default: `GATE_UP_DEFAULT`."""
    tiles = tiles or GATE_UP_DEFAULT
    assert x.dim() == 2 and x.stride(1) == 1 and w.dim() == 3 and w.is_contiguous()
    _, two_inner, k = w.shape
    assert x.shape[1] == k and two_inner % 2 == 0 and experts.dim() == 1
    inner, pairs = two_inner // 2, experts.shape[0]
    if bias is not None:
        assert bias.shape == (w.shape[0], two_inner) and bias.is_contiguous()
    if out is None:
        out = torch.empty((pairs, inner), dtype=x.dtype, device=x.device)
    assert out.shape == (pairs, inner) and out.stride(1) == 1
    if pairs:
        _gate_up_kernel[(pairs, triton.cdiv(inner, tiles.block_n))](
            x, w, experts, w if bias is None else bias, out, x.stride(0), out.stride(0),
            inner, k, alpha, limit, ROW_DIV=row_div, ACT=ACTIVATION_CODES[act],
            HAS_BIAS=bias is not None, BLOCK_N=tiles.block_n, BLOCK_K=tiles.block_k,
            num_warps=tiles.num_warps, num_stages=tiles.num_stages,
        )  # fmt: skip
    return out


def expert_down(
    act: torch.Tensor,
    w: torch.Tensor,
    experts: torch.Tensor,
    scale: torch.Tensor,
    topk: int,
    *,
    bias: torch.Tensor | None = None,
    out: torch.Tensor | None = None,
    tiles: GemvTiles | None = None,
) -> torch.Tensor:
    """`act` [T * topk, I] (token-major pairs), `w` [E, H, I], `scale` fp32 [T * topk] ->
    `[T, H]` in `act`'s dtype: each token's weighted sum over its experts (`tiles` default:
    `DOWN_DEFAULT`; one expert of weight 1 makes it a dense GEMV)."""
    tiles = tiles or DOWN_DEFAULT
    assert act.dim() == 2 and act.stride(1) == 1 and w.dim() == 3 and w.is_contiguous()
    _, n, k = w.shape
    pairs = experts.shape[0]
    assert act.shape == (pairs, k) and pairs % topk == 0
    assert scale.dtype == torch.float32 and scale.shape == (pairs,) and scale.is_contiguous()
    if bias is not None:
        assert bias.shape == (w.shape[0], n) and bias.is_contiguous()
    tokens = pairs // topk
    if out is None:
        out = torch.empty((tokens, n), dtype=act.dtype, device=act.device)
    assert out.shape == (tokens, n) and out.stride(1) == 1
    if not tokens:
        return out
    summed = torch.zeros((tokens, n), dtype=torch.float32, device=act.device)
    _down_kernel[(pairs, triton.cdiv(n, tiles.block_n))](
        act, w, experts, scale, w if bias is None else bias, summed, act.stride(0),
        summed.stride(0), n, k, TOPK=topk, HAS_BIAS=bias is not None,
        BLOCK_N=tiles.block_n, BLOCK_K=tiles.block_k, num_warps=tiles.num_warps,
        num_stages=tiles.num_stages,
    )  # fmt: skip
    return out.copy_(summed)


# Measured best launch shapes at batch 1, keyed by (kernel, N, K, pairs per token); other
# shapes take the kernel's default. From `resin bench tune-moe --graph` on the H200 (12 layers of
# distinct weights in one CUDA graph; docs/benchmarks.md), microseconds per layer in comments.
# `load_tiles` adds a sweep's file (`resin bench runner --gemv-tiles`).
GATE_UP_DEFAULT = GemvTiles(16, 128, 8)
DOWN_DEFAULT = GemvTiles(32, 128, 8)
TUNED: dict[tuple[str, int, int, int], GemvTiles] = {
    ("gate_up", 1536, 2048, 8): GemvTiles(8, 128, 8),  # Qwen3-30B-A3B, 15.5
    ("down", 2048, 768, 8): DOWN_DEFAULT,  # 11.4
    ("gate_up", 5760, 2880, 4): GATE_UP_DEFAULT,  # gpt-oss-20b, 37.8
    ("down", 2880, 2880, 4): GemvTiles(16, 128, 8),  # 24.0
    ("gate_up", 2816, 2048, 8): GATE_UP_DEFAULT,  # DeepSeek-V2-Lite (6 + 2 shared), 25.9
    ("down", 2048, 1408, 8): DOWN_DEFAULT,  # 16.6
}


def tiles_for(kernel: str, n: int, k: int, per_token: int) -> GemvTiles:
    default = GATE_UP_DEFAULT if kernel == "gate_up" else DOWN_DEFAULT
    return TUNED.get((kernel, n, k, per_token), default)


def load_tiles(path: str) -> int:
    """Add the `best` lines of a `resin bench tune-moe --graph` JSONL file to `TUNED`; returns
    how many."""
    import json

    count = 0
    with open(path) as f:
        for line in f:
            row = json.loads(line)
            if row.get("best") and row["kernel"] in ("gate_up", "down"):
                key = (row["kernel"], row["n"], row["k"], row["per_token"])
                TUNED[key] = GemvTiles(*(row[name] for name in GemvTiles._fields))
                count += 1
    return count
