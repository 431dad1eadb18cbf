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
the minimum traffic; larger batches use the grouped GEMM (`moe_grouped.py`). One kernel per
role for every weight format (`W_FMT`, compile time: dense, FP8, MXFP4; `GemvWeights`): the
row-dot (`quant_tiles.rows_dot`) is the only part that differs, so the prologue (pair,
expert, row) and the epilogue (bias, fused activation or weighted atomic sum) exist once.
The tile shape (`GemvTiles`) depends on the layer's shape and format: `tiles_for` reads the
GPU's tuned file (`tiles.py`).

Both kernels (and the grouped GEMM) declare Triton's `launch_metadata` hook
(`routed_bytes`): the bytes of a launch count only the routed experts of the stacks, for
profilers that read it (proton, `resin bench runner --kernels`); Triton calls it only while
a launch hook is installed.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import torch
import triton
import triton.language as tl

from resin_models_cuda.kernels.activation import ACTIVATION_CODES, Activation, gated
from resin_models_cuda.kernels.pdl import pdl_args, pdl_enter
from resin_models_cuda.kernels.quant_tiles import (
    DENSE,
    MXFP4,
    MXFP4_DOT,
    MXFP4_PAIRS,
    MXFP4_TC,
    expert_matrix,
    gemv_qk,
    rows_dot,
)
from resin_models_cuda.kernels.tiles import (
    DOWN_DEFAULT,
    GATE_UP_DEFAULT,
    KERNELS,
    GemvTiles,
    TileKey,
    add_tiles,
    gemv_tiles,
    parse_table,
    tiles_from,
)


class GemvWeights(NamedTuple):
    """A stack of expert matrices [E, N, K] as the expert kernels (GEMV and grouped GEMM)
    read it: `values` (dense [E, N, K], e4m3 [E, N, K], or MXFP4 bytes [E, N, K / 32, 16]),
    `scales` (FP8 float32 [E, cdiv(N, qn), cdiv(K, qk)], MXFP4 e8m0 [E, N, K / 32]; None when
    dense), the format code (`quant_tiles.DENSE` / `FP8` / `MXFP4` / `MXFP4_DOT` / ...) and
    the FP8 scale block."""

    values: torch.Tensor
    scales: torch.Tensor | None
    fmt: int
    block: tuple[int, int] = (1, 1)
    dot_fmt: str = ""  # MXFP4_DOT: "bf16" / "fp16"

    @staticmethod
    def of(w: torch.Tensor | GemvWeights) -> GemvWeights:
        """`w` as it is, or a dense stack."""
        return w if isinstance(w, GemvWeights) else GemvWeights(w, None, DENSE)

    def dims(self) -> tuple[int, int, int]:
        """(E, N, K) of the stack."""
        if self.fmt in (MXFP4, MXFP4_DOT, MXFP4_PAIRS, MXFP4_TC):
            e, n, g, _ = self.values.shape
            return int(e), int(n), int(g) * 32
        e, n, k = self.values.shape
        return int(e), int(n), int(k)


def distinct_experts(ids: torch.Tensor, experts: int) -> int:
    """How many distinct experts `ids` names (negative ids: none), read from the device; inside
    a CUDA-graph capture, which cannot read it, the bound min(len(ids), experts)."""
    if ids.is_cuda and torch.cuda.is_current_stream_capturing():
        return min(ids.numel(), experts)
    return int(torch.unique(ids[ids >= 0]).numel())


def routed_bytes(ids: str) -> Callable[[Any, Any, dict[str, Any]], dict[str, int]]:
    """Triton's `launch_metadata` hook, `(grid, metadata, {argument: value}) -> {"bytes": n}`,
    of an expert kernel whose argument `ids` holds the experts it reads: the stacks `w_ptr`,
    `s_ptr` (a distinct tensor) and `bias_ptr` (with `HAS_BIAS`) count one [E]-slice per
    distinct expert, every other tensor argument whole (each tensor once)."""

    def hook(grid: Any, metadata: Any, args: dict[str, Any]) -> dict[str, int]:
        w = args["w_ptr"]
        stacks = {w.data_ptr(): w}
        stacks.setdefault(args["s_ptr"].data_ptr(), args["s_ptr"])
        if args.get("HAS_BIAS"):
            stacks.setdefault(args["bias_ptr"].data_ptr(), args["bias_ptr"])
        per_expert = sum(t.numel() * t.element_size() // t.shape[0] for t in stacks.values())
        rest = {
            v.data_ptr(): v.numel() * v.element_size()
            for v in args.values()
            if isinstance(v, torch.Tensor) and v.data_ptr() not in stacks
        }
        routed = distinct_experts(args[ids], int(w.shape[0]))
        return {"bytes": routed * per_expert + sum(rest.values())}

    return hook


@triton.jit(launch_metadata=routed_bytes("expert_ptr"))
def _gate_up_kernel(
    x_ptr,  # [R, K], row stride stride_x, last dim contiguous
    w_ptr,  # [E, 2I, K] in format W_FMT: gate rows, then up rows
    s_ptr,  # its scales (W_FMT != DENSE)
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
    W_FMT: tl.constexpr,
    DOT_FMT: tl.constexpr,
    QN: tl.constexpr,
    QK: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    PDL: tl.constexpr,
):
    pdl_enter(PDL)
    p = tl.program_id(0)
    n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    nmask = n < INTER
    e = tl.load(expert_ptr + p).to(tl.int64)
    x_row = x_ptr + (p // ROW_DIV).to(tl.int64) * stride_x
    w_e, s_e = expert_matrix(w_ptr, s_ptr, e, 2 * INTER, K, W_FMT, QN, QK)
    gate = rows_dot(x_row, w_e, s_e, n, nmask, K, W_FMT, DOT_FMT, QN, QK, BLOCK_N, BLOCK_K)
    up = rows_dot(x_row, w_e, s_e, n + INTER, nmask, K, W_FMT, DOT_FMT, QN, QK, BLOCK_N,
                  BLOCK_K)  # fmt: skip
    if HAS_BIAS:
        gate += tl.load(bias_ptr + e * 2 * INTER + n, mask=nmask, other=0.0).to(tl.float32)
        up += tl.load(bias_ptr + e * 2 * INTER + INTER + n, mask=nmask, other=0.0).to(tl.float32)
    dtype = out_ptr.dtype.element_ty
    # Round gate and up to the storage dtype first, as the unfused [P, 2I] store did.
    out = gated(gate.to(dtype).to(tl.float32), up.to(dtype).to(tl.float32), alpha, limit, ACT,
                dtype)  # fmt: skip
    tl.store(out_ptr + p.to(tl.int64) * stride_o + n, out.to(dtype), mask=nmask)


@triton.jit(launch_metadata=routed_bytes("expert_ptr"))
def _down_kernel(
    act_ptr,  # [T * TOPK, K], row stride stride_a: pair rows, token-major
    w_ptr,  # [E, N, K] in format W_FMT
    s_ptr,  # its scales (W_FMT != DENSE)
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
    W_FMT: tl.constexpr,
    DOT_FMT: tl.constexpr,
    QN: tl.constexpr,
    QK: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    PDL: tl.constexpr,
):
    pdl_enter(PDL)
    p = tl.program_id(0).to(tl.int64)
    n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    nmask = n < N
    e = tl.load(expert_ptr + p).to(tl.int64)
    w_e, s_e = expert_matrix(w_ptr, s_ptr, e, N, K, W_FMT, QN, QK)
    y = rows_dot(act_ptr + p * stride_a, w_e, s_e, n, nmask, K, W_FMT, DOT_FMT, QN, QK, BLOCK_N,
                 BLOCK_K)  # fmt: skip
    if HAS_BIAS:
        y += tl.load(bias_ptr + e * N + n, mask=nmask, other=0.0).to(tl.float32)
    tl.atomic_add(out_ptr + (p // TOPK) * stride_o + n, tl.load(scale_ptr + p) * y, mask=nmask)


def expert_gate_up(
    x: torch.Tensor,
    w: torch.Tensor | GemvWeights,
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
    """`x` [R, H], `w` [E, 2I, H] (dense, or any format as `GemvWeights`: the quantized
    modules' wrappers check their layouts), `experts` [P] -> activated `[P, I]` (pair p reads
    row `p // row_div` of `x`); `tiles` default: `GATE_UP_DEFAULT`."""
    tiles = tiles or GATE_UP_DEFAULT
    gw = GemvWeights.of(w)
    assert x.dim() == 2 and x.stride(1) == 1 and gw.values.is_contiguous()
    e, two_inner, k = gw.dims()
    assert x.shape[1] == k and two_inner % 2 == 0 and experts.dim() == 1
    inner, pairs = two_inner // 2, experts.shape[0]
    if bias is not None:
        assert bias.shape == (e, two_inner) and bias.is_contiguous()
    if out is None:
        out = torch.empty((pairs, inner), dtype=x.dtype, device=x.device)
    assert out.shape == (pairs, inner) and out.stride(1) == 1
    if pairs:
        values = gw.values
        _gate_up_kernel[(pairs, triton.cdiv(inner, tiles.block_n))](
            x, values, values if gw.scales is None else gw.scales, experts,
            values if bias is None else bias, out, x.stride(0), out.stride(0), inner, k, alpha,
            limit, ROW_DIV=row_div, ACT=ACTIVATION_CODES[act], HAS_BIAS=bias is not None,
            W_FMT=gw.fmt, DOT_FMT=gw.dot_fmt, QN=gw.block[0], QK=gemv_qk(gw.block[1], k),
            BLOCK_N=tiles.block_n, BLOCK_K=tiles.block_k, num_warps=tiles.num_warps,
            num_stages=tiles.num_stages, **pdl_args(),
        )  # fmt: skip
    return out


def expert_down(
    act: torch.Tensor,
    w: torch.Tensor | GemvWeights,
    experts: torch.Tensor,
    scale: torch.Tensor,
    topk: int,
    *,
    bias: torch.Tensor | None = None,
    out: torch.Tensor | None = None,
    tiles: GemvTiles | None = None,
) -> torch.Tensor:
    """`act` [T * topk, I] (token-major pairs), `w` [E, H, I] (dense or `GemvWeights`),
    `scale` fp32 [T * topk] -> `[T, H]` in `act`'s dtype: each token's weighted sum over its
    experts (`tiles` default: `DOWN_DEFAULT`; one expert of weight 1 makes it a dense GEMV)."""
    tiles = tiles or DOWN_DEFAULT
    gw = GemvWeights.of(w)
    assert act.dim() == 2 and act.stride(1) == 1 and gw.values.is_contiguous()
    e, n, k = gw.dims()
    pairs = experts.shape[0]
    assert act.shape == (pairs, k) and pairs % topk == 0
    assert scale.dtype == torch.float32 and scale.shape == (pairs,) and scale.is_contiguous()
    if bias is not None:
        assert bias.shape == (e, n) and bias.is_contiguous()
    tokens = pairs // topk
    if out is None:
        out = torch.empty((tokens, n), dtype=act.dtype, device=act.device)
    assert out.shape == (tokens, n) and out.stride(1) == 1
    if not tokens:
        return out
    summed = torch.zeros((tokens, n), dtype=torch.float32, device=act.device)
    values = gw.values
    _down_kernel[(pairs, triton.cdiv(n, tiles.block_n))](
        act, values, values if gw.scales is None else gw.scales, experts, scale,
        values if bias is None else bias, summed, act.stride(0), summed.stride(0), n, k,
        TOPK=topk, HAS_BIAS=bias is not None, W_FMT=gw.fmt, DOT_FMT=gw.dot_fmt,
        QN=gw.block[0], QK=gemv_qk(gw.block[1], k), BLOCK_N=tiles.block_n,
        BLOCK_K=tiles.block_k,
        num_warps=tiles.num_warps, num_stages=tiles.num_stages, **pdl_args(),
    )  # fmt: skip
    return out.copy_(summed)


def tiles_for(kernel: str, n: int, k: int, per_token: int, fmt: str = "dense") -> GemvTiles:
    """The launch shape of `kernel` ("gate_up" / "down") for experts [E, n, k] in `fmt` at
    `per_token` pairs per token (`tiles.gemv_tiles`: the GPU's tuned file, else defaults)."""
    return gemv_tiles(kernel, fmt, n, k, per_token)


def load_tiles(path: str) -> int:
    """Add a tile file's entries (`.json`: `resin bench tune-gemv --tiles-json`) or the `best`
    lines of a `resin bench tune-moe --graph` JSONL file, taking precedence over the tuned
    files; returns how many."""
    import json

    table: dict[TileKey, GemvTiles] = {}
    if path.endswith(".json"):
        with open(path) as f:
            return add_tiles(parse_table(json.load(f)))
    with open(path) as f:
        for line in f:
            row = json.loads(line)
            if row.get("best") and row["kernel"] in KERNELS:
                key = TileKey(row["kernel"], row.get("format", "dense"), row["n"], row["k"],
                              row.get("rows", row.get("per_token", 1)))  # fmt: skip
                table[key] = tiles_from(row)
    return add_tiles(table)
