# mypy: disable-error-code="untyped-decorator,no-untyped-def"
"""Dense matmul with FP8 e4m3 weights: `out[m, n] = sum_k x[m, k] * W[n, k] (+ bias[n])` with
`W[n, k] = w[n, k] * w_scale[n // qn, k // qk]` (`resin_model.quant`'s scale blocks: DeepSeek /
Qwen3 blocks (128, 128), per-channel (1, K), per-tensor (N, K)).

Three ways to take the activations (`fp8_gemm`):
- **weight-only**: `x` in bf16 / fp16 / fp32; each weight tile is converted in registers and
  the dot runs in `x`'s dtype (decode: the bytes are the weights, half of bf16's);
- **pre-quantized**: `x` e4m3 with float32 scales per row and group of `x_group` columns
  (`fp8_quant.quantize_fp8_rows`): an e4m3 tensor-core dot;
- **fused group quantization** (`quantize_group = BLOCK_K`, block FP8's 128): each program
  quantizes its activation tile per row before the e4m3 dot, so no quantized copy of `x` is
  written and no extra launch runs (per-token scales need the whole row first, so the
  per-channel scheme takes the pre-quantized path).

Each K tile lies inside one weight scale block (`qk % BLOCK_K == 0`, or one block spans K), so
a tile's partial sum is scaled once per output column. `scaled_mm_fp8` is the cuBLASLt path
for per-tensor / per-channel weights (`torch._scaled_mm`, row-wise scales), to measure against.
`fp8_gemv` is the decode path for 1-16 rows, in two forms chosen by its tiles: the FMA
row-dot of the expert GEMVs (`quant_tiles.fp8_rows_dot`, one program per (row, column tile)),
or the tensor-core row tile (`tensor_core`): one program per column tile (and K split) holds
every row of x, padded to 16, and streams its e4m3 rows once, upcast in registers to x's
dtype and multiplied on the tensor cores with float32 sums. The upcast is what bounds a GEMV
of 8-bit weights on the H200: e4m3 -> float32 goes through float16 and costs one and a half
conversions per weight at the conversion units' rate (16 per clock per multiprocessor, about
4.2 T weights/s: the FMA form cannot pass ~2.9 TB/s), while e4m3 -> bf16 by bit moves
(`e4m3_to_bf16`: two permutes, masks and one bf16x2 multiply per four weights) runs on the
integer and half-precision units. Grid-stable, no host sync: CUDA-graph safe.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import triton
import triton.language as tl

from resin_models_cuda.kernels.fp8_quant import quantize_fp8_rows
from resin_models_cuda.kernels.pdl import pdl_args, pdl_enter
from resin_models_cuda.kernels.quant_tiles import (
    INTERPRETED,
    fp8_rows_dot,
    fp8_tile_dot,
    gemv_qk,
)
from resin_models_cuda.kernels.tiles import FP8_GEMV_DEFAULT, GemvTiles


class GemmTiles(NamedTuple):
    """Launch shape of `fp8_gemm` (swept by `resin bench quant-kernels`)."""

    block_m: int = 64
    block_n: int = 128
    block_k: int = 128
    group_m: int = 8
    num_warps: int = 4
    num_stages: int = 3
    split_k: int = 1  # > 1: K split over programs adding into a float32 sum (small M)


@triton.jit
def _fp8_gemm_kernel(
    x_ptr,  # [M, K] float (A_MODE 0, 2) or float8e4nv (A_MODE 1), row stride stride_x
    xs_ptr,  # float32 [M, cdiv(K, GK)] contiguous (A_MODE 1)
    w_ptr,  # float8e4nv [N, K] contiguous
    ws_ptr,  # float32 [cdiv(N, QN), cdiv(K, QK)] contiguous
    bias_ptr,  # [N] (HAS_BIAS)
    out_ptr,  # [M, N], row stride stride_o
    M,
    N,
    K,
    stride_x,
    stride_o,
    A_MODE: tl.constexpr,  # 0 weight-only, 1 pre-quantized x, 2 quantize x per K tile
    QN: tl.constexpr,
    QK: tl.constexpr,
    GK: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr,
    SPLIT_K: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    PDL: tl.constexpr,
):
    # Programs walk GROUP_M row tiles per column tile, so neighbours share weight tiles in L2.
    pdl_enter(PDL)
    pid = tl.program_id(0)
    tiles_m, tiles_n = tl.cdiv(M, BLOCK_M), tl.cdiv(N, BLOCK_N)
    first_m = pid // (GROUP_M * tiles_n) * GROUP_M
    rows_in_group = tl.minimum(tiles_m - first_m, GROUP_M)
    pid_m = first_m + (pid % (GROUP_M * tiles_n)) % rows_in_group
    pid_n = (pid % (GROUP_M * tiles_n)) // rows_in_group
    m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    mmask, nmask = m < M, n < N
    w_scale_row = ws_ptr + (n // QN) * tl.cdiv(K, QK)
    acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    span = tl.cdiv(tl.cdiv(K, BLOCK_K), SPLIT_K) * BLOCK_K
    k_lo = tl.program_id(1) * span
    for k0 in range(k_lo, tl.minimum(k_lo + span, K), BLOCK_K):
        k = k0 + tl.arange(0, BLOCK_K)
        kmask = k < K
        a = tl.load(x_ptr + m[:, None].to(tl.int64) * stride_x + k[None, :],
                    mask=mmask[:, None] & kmask[None, :], other=0.0)  # fmt: skip
        b = tl.load(w_ptr + n[None, :].to(tl.int64) * K + k[:, None],
                    mask=nmask[None, :] & kmask[:, None], other=0.0)  # fmt: skip
        if A_MODE == 1:
            a_scale = tl.load(xs_ptr + m * tl.cdiv(K, GK) + k0 // GK, mask=mmask, other=0.0)
            part = tl.dot(a, b) * a_scale[:, None]
        else:
            part = fp8_tile_dot(a, b, A_MODE == 2, DOT_PRECISION)
        acc += part * tl.load(w_scale_row + k0 // QK, mask=nmask, other=0.0)[None, :]
    if HAS_BIAS:  # added once: by the first K split
        first = (tl.program_id(1) == 0).to(tl.float32)
        acc += first * tl.load(bias_ptr + n, mask=nmask, other=0.0).to(tl.float32)[None, :]
    out = out_ptr + m[:, None].to(tl.int64) * stride_o + n[None, :]
    if SPLIT_K > 1:  # out: a zeroed float32 sum
        tl.atomic_add(out, acc, mask=mmask[:, None] & nmask[None, :])
    else:
        tl.store(out, acc.to(out_ptr.dtype.element_ty), mask=mmask[:, None] & nmask[None, :])


@triton.jit
def _fp8_gemv_kernel(
    x_ptr,  # [M, K] float, row stride stride_x
    w_ptr,  # float8e4nv [N, K] contiguous
    ws_ptr,  # float32 [cdiv(N, QN), cdiv(K, QK)] contiguous
    bias_ptr,  # [N] (HAS_BIAS)
    out_ptr,  # [M, N], row stride stride_o
    M,
    N,
    K,
    stride_x,
    stride_o,
    QN: tl.constexpr,
    QK: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    PDL: tl.constexpr,
):
    # The rows of one weight tile are neighbouring programs, so a tile read for one row is in
    # L2 for the others: DRAM sees the weights about once.
    pdl_enter(PDL)
    pid = tl.program_id(0)
    row = (pid % M).to(tl.int64)
    n = (pid // M) * BLOCK_N + tl.arange(0, BLOCK_N)
    nmask = n < N
    y = fp8_rows_dot(x_ptr + row * stride_x, w_ptr, ws_ptr, n, nmask, K, QN, QK, BLOCK_N,
                     BLOCK_K)  # fmt: skip
    if HAS_BIAS:
        y += tl.load(bias_ptr + n, mask=nmask, other=0.0).to(tl.float32)
    tl.store(out_ptr + row * stride_o + n, y.to(out_ptr.dtype.element_ty), mask=nmask)


@triton.jit
def e4m3_to_bf16(w):
    """uint8 e4m3 bit patterns -> bf16 values, exactly (subnormals too; NaN codes are not
    weights): each byte is moved into the top of a 16-bit lane (`prmt`), its seven magnitude
    bits shifted down four places, which makes a bf16 of value `w * 2 ** -120` (the e4m3
    exponent field lands in the bf16 one, bias 7 against 127), and one bf16x2 multiply by
    2 ** 120 restores it. Four weights per call; compiled code only (the interpreter has no
    inline assembly: `INTERPRETED` callers convert through float32 instead)."""
    return tl.inline_asm_elementwise(
        asm="""
        {
        .reg .b32 a<2>, b<2>, c;
        prmt.b32 a0, 0, $2, 0x5040;
        prmt.b32 a1, 0, $2, 0x7060;
        and.b32 b0, a0, 0x7f007f00;
        and.b32 b1, a1, 0x7f007f00;
        shr.b32 b0, b0, 4;
        shr.b32 b1, b1, 4;
        and.b32 a0, a0, 0x80008000;
        and.b32 a1, a1, 0x80008000;
        or.b32 b0, b0, a0;
        or.b32 b1, b1, a1;
        mov.b32 c, 0x7b807b80;
        mul.rn.bf16x2 $0, b0, c;
        mul.rn.bf16x2 $1, b1, c;
        }
        """,
        constraints="=r,=r,r",
        args=[w],
        dtype=tl.bfloat16,
        is_pure=True,
        pack=4,
    )


@triton.jit
def _fp8_gemv_tc_kernel(
    x_ptr,  # [M, K] float, M <= 16, row stride stride_x
    w_ptr,  # float8e4nv [N, K] contiguous
    ws_ptr,  # float32 [cdiv(N, QN), cdiv(K, QK)] contiguous ([cdiv(N, QN)] when QK == 0)
    bias_ptr,  # [N] (HAS_BIAS)
    out_ptr,  # [M, N], row stride stride_o (float32 zeros when SPLIT_K > 1)
    M,
    N,
    K,
    stride_x,
    stride_o,
    QN: tl.constexpr,
    QK: tl.constexpr,  # 0: one scale per QN rows over all of K
    HAS_BIAS: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,  # K per loop step: SUB tiles of BK columns, each in one scale block
    BK: tl.constexpr,
    SPLIT_K: tl.constexpr,
    PDL: tl.constexpr,
):
    # acc[n, m] = sum_k W[n, k] * x[m, k]: the weight tile is the MMA's row operand, so the
    # 16-row minimum of a tensor-core tile falls on x's few rows, not on the weights.
    pdl_enter(PDL)
    pid_n = tl.program_id(0)
    n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    nmask = n < N
    m = tl.arange(0, 16)
    mmask = m < M
    acc = tl.zeros([BLOCK_N, 16], tl.float32)
    span = tl.cdiv(tl.cdiv(K, BLOCK_K), SPLIT_K) * BLOCK_K
    k_lo = tl.program_id(1) * span
    w_rows = w_ptr + n[:, None].to(tl.int64) * K
    x_rows = x_ptr + m[None, :] * stride_x
    if QK != 0:
        scale_row = ws_ptr + (n // QN) * tl.cdiv(K, QK)
    for k0 in range(k_lo, tl.minimum(k_lo + span, K), BLOCK_K):
        for sub in tl.static_range(BLOCK_K // BK):
            k = k0 + sub * BK + tl.arange(0, BK)
            kmask = k < K
            w = tl.load(w_rows + k[None, :], mask=nmask[:, None] & kmask[None, :], other=0.0)
            x = tl.load(x_rows + k[:, None], mask=mmask[None, :] & kmask[:, None], other=0.0)
            if x_ptr.dtype.element_ty == tl.float32:
                part = tl.dot(w.to(tl.float32), x, input_precision="ieee")
            elif x_ptr.dtype.element_ty == tl.float16:
                part = tl.dot(w.to(tl.float16), x)
            elif INTERPRETED:
                part = tl.dot(w.to(tl.float32).to(tl.bfloat16), x)
            else:
                part = tl.dot(e4m3_to_bf16(w.to(tl.uint8, bitcast=True)), x)
            if QK != 0:
                kb = (k0 + sub * BK) // QK
                part = part * tl.load(scale_row + kb, mask=nmask, other=0.0)[:, None]
            acc += part
    if QK == 0:
        acc = acc * tl.load(ws_ptr + n // QN, mask=nmask, other=0.0)[:, None]
    if HAS_BIAS:  # added once: by the first K split
        first = (tl.program_id(1) == 0).to(tl.float32)
        acc += first * tl.load(bias_ptr + n, mask=nmask, other=0.0).to(tl.float32)[:, None]
    out = out_ptr + m[None, :].to(tl.int64) * stride_o + n[:, None]
    if SPLIT_K > 1:
        tl.atomic_add(out, acc, mask=nmask[:, None] & mmask[None, :])
    else:
        tl.store(out, acc.to(out_ptr.dtype.element_ty), mask=nmask[:, None] & mmask[None, :])


TC_MAX_ROWS = 16  # x rows of one tensor-core GEMV tile


def tc_sub_k(qk: int, k: int, block_k: int) -> int:
    """The tensor-core GEMV's inner tile width: `block_k`, narrowed to the scale block where
    blocks are finer than it (0: the tiling does not fit: blocks under 16 columns, or not
    dividing `block_k`)."""
    if qk >= k or qk % block_k == 0:
        return block_k
    return qk if block_k % qk == 0 and qk >= 16 and qk & (qk - 1) == 0 else 0


def fp8_tile_fits(qk: int, k: int, block_k: int, spans: bool = False) -> bool:
    """Whether K tiles of `block_k` stay inside one scale block of `qk` columns (or one block
    spans K), or, `spans` (the row-dot of the GEMVs), cover whole power-of-two blocks."""
    if qk >= k or qk % block_k == 0:
        return True
    return spans and block_k % qk == 0 and qk & (qk - 1) == 0


def fp8_gemv(
    x: torch.Tensor,
    w: torch.Tensor,
    w_scale: torch.Tensor,
    block: tuple[int, int],
    *,
    bias: torch.Tensor | None = None,
    tiles: GemvTiles | None = None,
) -> torch.Tensor:
    """`x` [M, K] (a few rows, any float dtype) @ dequantized `w` [N, K]^T (+ bias) -> [M, N]
    in `x`'s dtype, for decode, where the bytes are the weights. `tiles.tensor_core`: up to
    16 rows in one program per (column tile, K split), the e4m3 tile upcast to `x`'s dtype
    and multiplied on the tensor cores (the 16-row minimum falls on x's rows, padded), scale
    blocks at least 16 wide and power-of-two (or spanning K); else each program one row and
    `tiles.block_n` output columns, streaming its e4m3 rows in wide tiles converted in
    registers (float32 products and sums)."""
    tiles = tiles or FP8_GEMV_DEFAULT
    assert x.dim() == 2 and x.stride(1) == 1 and w.dim() == 2
    (m, k), n = x.shape, w.shape[0]
    assert w.shape[1] == k, (x.shape, w.shape)
    check_fp8_weight(w, w_scale, block)
    assert x.dtype in (torch.bfloat16, torch.float16, torch.float32), x.dtype
    if bias is not None:
        assert bias.shape == (n,) and bias.is_contiguous()
    if tiles.tensor_core:
        return _fp8_gemv_tc(x, w, w_scale, block, bias, tiles)
    assert fp8_tile_fits(block[1], k, tiles.block_k, spans=True), (block, tiles.block_k)
    out = torch.empty((m, n), dtype=x.dtype, device=x.device)
    if m == 0:
        return out
    _fp8_gemv_kernel[(triton.cdiv(n, tiles.block_n) * m,)](
        x, w, w_scale, w if bias is None else bias, out, m, n, k, x.stride(0), out.stride(0),
        QN=block[0], QK=gemv_qk(block[1], k), HAS_BIAS=bias is not None,
        BLOCK_N=tiles.block_n, BLOCK_K=tiles.block_k, num_warps=tiles.num_warps,
        num_stages=tiles.num_stages, **pdl_args(),
    )  # fmt: skip
    return out


def _fp8_gemv_tc(x: torch.Tensor, w: torch.Tensor, w_scale: torch.Tensor,
                 block: tuple[int, int], bias: torch.Tensor | None, tiles: GemvTiles) -> (
    torch.Tensor
):  # fmt: skip
    (m, k), n = x.shape, w.shape[0]
    assert m <= TC_MAX_ROWS, f"the tensor-core GEMV takes up to {TC_MAX_ROWS} rows, not {m}"
    assert tiles.block_n >= 16 and tiles.block_k >= 16, tiles
    bk = tc_sub_k(block[1], k, tiles.block_k)
    assert bk, f"scale blocks {block} do not tile K tiles of {tiles.block_k}"
    out = torch.empty((m, n), dtype=x.dtype, device=x.device)
    if m == 0:
        return out
    dest = out if tiles.split_k == 1 else torch.zeros((m, n), dtype=torch.float32,
                                                       device=x.device)  # fmt: skip
    grid = (triton.cdiv(n, tiles.block_n), tiles.split_k)
    _fp8_gemv_tc_kernel[grid](
        x, w, w_scale, w if bias is None else bias, dest, m, n, k, x.stride(0), dest.stride(0),
        QN=block[0], QK=gemv_qk(block[1], k), HAS_BIAS=bias is not None, BLOCK_N=tiles.block_n,
        BLOCK_K=tiles.block_k, BK=bk, SPLIT_K=tiles.split_k, num_warps=tiles.num_warps,
        num_stages=tiles.num_stages, **pdl_args(),
    )  # fmt: skip
    return out if dest is out else out.copy_(dest)


def check_fp8_weight(w: torch.Tensor, w_scale: torch.Tensor, block: tuple[int, int]) -> None:
    """`w` e4m3 [..., N, K] contiguous, `w_scale` float32 [..., cdiv(N, qn), cdiv(K, qk)]."""
    n, k = w.shape[-2:]
    qn, qk = block
    assert w.dtype == torch.float8_e4m3fn and w.is_contiguous(), (w.dtype, w.stride())
    want = (*w.shape[:-2], triton.cdiv(n, qn), triton.cdiv(k, qk))
    assert w_scale.dtype == torch.float32 and w_scale.is_contiguous(), w_scale.dtype
    assert tuple(w_scale.shape) == want, (tuple(w_scale.shape), want)


def fp8_gemm(
    x: torch.Tensor,
    w: torch.Tensor,
    w_scale: torch.Tensor,
    block: tuple[int, int],
    *,
    x_scale: torch.Tensor | None = None,
    x_group: int | None = None,
    quantize_group: int | None = None,
    bias: torch.Tensor | None = None,
    out: torch.Tensor | None = None,
    out_dtype: torch.dtype | None = None,
    tiles: GemmTiles | None = None,
) -> torch.Tensor:
    """`x` [M, K] @ dequantized `w` [N, K]^T -> [M, N] (module docstring). Weight-only unless
    `x_scale` is given (then `x` is e4m3 with scales per row and `x_group` columns, None: per
    row) or `quantize_group` is (fused dynamic quantization; must equal `tiles.block_k`)."""
    tiles = tiles or GemmTiles()
    assert x.dim() == 2 and x.stride(1) == 1 and w.dim() == 2
    (m, k), n = x.shape, w.shape[0]
    assert w.shape[1] == k, (x.shape, w.shape)
    check_fp8_weight(w, w_scale, block)
    assert block[1] % tiles.block_k == 0 or block[1] >= k, (block, tiles.block_k)
    a_mode, gk = 0, k
    if x_scale is not None:
        gk = k if x_group is None else x_group
        assert x.dtype == torch.float8_e4m3fn and x_scale.dtype == torch.float32
        assert x_scale.shape == (m, triton.cdiv(k, gk)) and x_scale.is_contiguous()
        assert gk % tiles.block_k == 0 or gk >= k, (gk, tiles.block_k)
        a_mode = 1
    elif quantize_group is not None:
        assert quantize_group == tiles.block_k and x.is_floating_point(), quantize_group
        a_mode = 2
    else:
        assert x.dtype in (torch.bfloat16, torch.float16, torch.float32), x.dtype
    if bias is not None:
        assert bias.shape == (n,) and bias.is_contiguous()
    if out is None:
        dtype = out_dtype or (torch.bfloat16 if x.dtype == torch.float8_e4m3fn else x.dtype)
        out = torch.empty((m, n), dtype=dtype, device=x.device)
    assert out.shape == (m, n) and out.stride(1) == 1
    if m == 0:
        return out
    dest = out
    if tiles.split_k > 1:
        dest = torch.zeros((m, n), dtype=torch.float32, device=x.device)
    grid = (triton.cdiv(m, tiles.block_m) * triton.cdiv(n, tiles.block_n), tiles.split_k)
    _fp8_gemm_kernel[grid](
        x, w_scale if x_scale is None else x_scale, w, w_scale, w if bias is None else bias,
        dest, m, n, k, x.stride(0), dest.stride(0), A_MODE=a_mode, QN=block[0], QK=block[1],
        GK=gk, HAS_BIAS=bias is not None, BLOCK_M=tiles.block_m, BLOCK_N=tiles.block_n,
        BLOCK_K=tiles.block_k, GROUP_M=tiles.group_m, SPLIT_K=tiles.split_k,
        DOT_PRECISION="ieee" if x.dtype == torch.float32 else "tf32",
        num_warps=tiles.num_warps, num_stages=tiles.num_stages, **pdl_args(),
    )  # fmt: skip
    return out if dest is out else out.copy_(dest)


def scaled_mm_fp8(
    x: torch.Tensor,
    w: torch.Tensor,
    w_scale: torch.Tensor,
    *,
    out_dtype: torch.dtype | None = None,
) -> torch.Tensor:
    """cuBLASLt FP8 matmul for per-tensor / per-channel weights: `x` [M, K] (float) quantized
    per token (`quantize_fp8_rows`), then `torch._scaled_mm` with row-wise scales.
    `w` e4m3 [N, K], `w_scale` float32 of N values ([N, 1]) or one ([1, 1]); K and N
    multiples of 16 (cuBLASLt's FP8 alignment)."""
    assert x.dim() == 2 and w.dim() == 2 and x.shape[1] == w.shape[1]
    n, k = w.shape
    assert w.dtype == torch.float8_e4m3fn and w.is_contiguous()
    assert w_scale.dtype == torch.float32 and w_scale.numel() in (1, n), w_scale.shape
    assert k % 16 == 0 and n % 16 == 0, (n, k)
    scale_b = w_scale.reshape(1, -1).expand(1, n)
    if not scale_b.is_contiguous():
        scale_b = scale_b.contiguous()
    x_q, x_scale = quantize_fp8_rows(x)
    dtype = out_dtype or x.dtype
    return torch._scaled_mm(x_q, w.t(), scale_a=x_scale, scale_b=scale_b, out_dtype=dtype)
