# mypy: disable-error-code="untyped-decorator,no-untyped-def"
"""In-register pieces of the quantized formats (`resin_model.quant` has their definitions),
shared by the FP8 and MXFP4 kernels:

- `fp8_quantize_rows`: one tile's rows to e4m3 with a scale per row (amax / 448), the dynamic
  activation quantization of block FP8 (a tile of 128 columns is one group); `to_fp8`: the
  saturating, round-to-nearest-even cast it ends with;
- `e2m1_x4`: an e2m1 code (0..15) as float32, times 4 (integer arithmetic, exact);
- `e8m0_quarter`: an e8m0 exponent as float32 `2 ** (code - 127) / 4`, by building its bits
  (codes 0..2 flush to 0: their true values are below 2**-125, far under any weight's scale);
- `rows_dot`: float32 `W[n, :] @ x` over rows of one matrix in any weight format (dense,
  FP8, MXFP4 decoded here by `e2m1_bits` or through `tl.dot_scaled`): the inner loop of every
  GEMV kernel, which differ in nothing else; `expert_matrix`: where one expert's values and
  scales start in a stack of any format (the GEMV and the grouped GEMM);
- the grouped GEMM's K-tile pieces: `fp8_tile_dot` (weight-only or quantized activations, as
  `fp8_gemm` takes them too), `mxfp4_packed_tile` (`tl.dot_scaled`'s operands, shared with
  the GEMV's) and `mxfp4_tile` (one nibble of a K tile decoded for `tl.dot`).
"""

from __future__ import annotations

import os

import triton
import triton.language as tl

FP8_MAX = tl.constexpr(448.0)
# Triton's interpreter (3.9, checked) narrows float32 to e4m3 by truncating and adding the
# cut-off bit with an OR: no ties-to-even, and a carry out of the mantissa can halve the value
# (7.75 -> 4). Under the interpreter the value is first rounded onto the e4m3 grid in float32,
# so its cast is exact; compiled code keeps the hardware conversion (cvt.rn.satfinite).
INTERPRETED = tl.constexpr(os.environ.get("TRITON_INTERPRET", "0") == "1")


@triton.jit
def to_fp8(v):
    """float32 -> float8e4nv, saturating at +-448, rounding to nearest even."""
    v = tl.minimum(tl.maximum(v, -FP8_MAX), FP8_MAX)
    if INTERPRETED:
        # One e4m3 step at v's binade (2**-9 in the subnormal range), and the float32 add of
        # 1.5 * 2**23 steps rounds v to a multiple of it, ties to even.
        binade = tl.maximum((v.to(tl.int32, bitcast=True) >> 23) & 0xFF, 127 - 6)
        step = ((binade - 3) << 23).to(tl.float32, bitcast=True)
        magic = step * 12582912.0
        v = (v + magic) - magic
    return v.to(tl.float8e4nv)


@triton.jit
def fp8_quantize_rows(a):
    """float32 tile [R, C] -> (float8e4nv tile, float32 scale [R]) with `a ~= q * scale`."""
    scale = tl.maximum(tl.max(tl.abs(a), 1) / FP8_MAX, 1e-12)
    return to_fp8(a / scale[:, None]), scale


@triton.jit
def fp8_tile_dot(a, b, QUANTIZE_X: tl.constexpr, DOT_PRECISION: tl.constexpr):
    """One K tile's float32 `a @ b` with e4m3 weights `b` [BK, BN], before their scale: in
    `a`'s dtype (weight-only), or, `QUANTIZE_X`, `a` quantized per row (`fp8_quantize_rows`)
    and an e4m3 dot scaled back per row."""
    if QUANTIZE_X:
        a_q, a_scale = fp8_quantize_rows(a.to(tl.float32))
        part = tl.dot(a_q, b) * a_scale[:, None]
    else:
        part = tl.dot(a, b.to(a.dtype), input_precision=DOT_PRECISION)
    return part


@triton.jit
def e2m1_x4(code):
    """int32 e2m1 codes -> float32 value * 4: exponent bits e = (code >> 1) & 3, mantissa bit
    m; magnitude m / 2 when e == 0, else (1 + m / 2) * 2 ** (e - 1); sign bit 3."""
    e = (code >> 1) & 3
    m = code & 1
    mag = tl.where(e == 0, 2 * m, (2 + m) << e).to(tl.float32)
    return tl.where((code & 8) != 0, -mag, mag)


@triton.jit
def e8m0_quarter(code):
    """int32 e8m0 codes -> float32 2 ** (code - 129) (the 4 of `e2m1_x4` folded in)."""
    return (tl.maximum(code - 2, 0) << 23).to(tl.float32, bitcast=True)


@triton.jit
def e2m1_bits(b, HIGH: tl.constexpr):
    """The low (or HIGH) e2m1 nibble of int32 bytes `b` as float32 `value * 2 ** -126`: the
    sign to bit 31 and the three magnitude bits (e1 e0 m) to bits 24..22, which makes an
    exponent field of e and a mantissa of m / 2, so e > 0 reads 2 ** (e - 127) * (1 + m / 2)
    and e == 0 the subnormal m * 2 ** -127: e2m1's values times 2 ** -126 in four integer
    operations (no table, no branch)."""
    if HIGH:
        b = b >> 4
    return (((b & 0x8) << 28) | ((b & 0x7) << 22)).to(tl.float32, bitcast=True)


# `e2m1_bits` values are scaled by 2 ** -126 and the activations by 2 ** X_SHIFT, so products
# stay normal floats for activations above 2 ** -100; the group scale takes back 2 ** (126 - X).
X_SHIFT = tl.constexpr(100)
X_SCALE = tl.constexpr(2.0**100)


@triton.jit
def e8m0_shifted(code):
    """int32 e8m0 codes -> float32 `2 ** (code - 127 + 126 - X_SHIFT)` (codes whose value
    would be subnormal flush to 0: real weight scales are far above them)."""
    biased = tl.minimum(tl.maximum(code + 126 - X_SHIFT, 0), 254)
    return (biased << 23).to(tl.float32, bitcast=True)


@triton.jit
def _mxfp4_rows_regs(x_ptr, b_ptr, s_ptr, n, nmask, K, BLOCK_N: tl.constexpr,
                    BLOCK_G: tl.constexpr):  # fmt: skip
    """float32 `W[n, :] @ x` for rows `n` of one expert's MXFP4 matrix (bytes [N, K / 2],
    scales [N, K / 32]), `BLOCK_G` groups of 32 values per step: a [rows, groups, 16 bytes]
    tile (16-byte loads along each row), each nibble decoded by `e2m1_bits` and multiplied by
    the (pre-scaled) activation, summed per group before its scale multiplies once."""
    groups = K // 32
    acc = tl.zeros([BLOCK_N, BLOCK_G], tl.float32)
    j = tl.arange(0, 16)
    for g0 in range(0, groups, BLOCK_G):
        g = g0 + tl.arange(0, BLOCK_G)
        gmask = g < groups
        byte = g[:, None] * 16 + j[None, :]  # [G, 16] byte index in the row
        x_even = tl.load(x_ptr + 2 * byte, mask=gmask[:, None], other=0.0).to(tl.float32)
        x_odd = tl.load(x_ptr + 2 * byte + 1, mask=gmask[:, None], other=0.0).to(tl.float32)
        x_even, x_odd = x_even * X_SCALE, x_odd * X_SCALE
        wmask = nmask[:, None] & gmask[None, :]
        w = tl.load(b_ptr + n[:, None, None].to(tl.int64) * (K // 2) + byte[None, :, :],
                    mask=wmask[:, :, None], other=0).to(tl.int32)  # fmt: skip
        part = e2m1_bits(w, False) * x_even[None, :, :] + e2m1_bits(w, True) * x_odd[None, :, :]
        code = tl.load(s_ptr + n[:, None].to(tl.int64) * groups + g[None, :], mask=wmask,
                       other=0)  # fmt: skip
        acc += tl.sum(part, 2) * e8m0_shifted(code.to(tl.int32))
    return tl.sum(acc, 1)


@triton.jit
def _mxfp4_rows_pairs(x_ptr, b_ptr, s_ptr, n, nmask, K, BLOCK_N: tl.constexpr,
                      BLOCK_G: tl.constexpr):  # fmt: skip
    """`_mxfp4_rows_regs` with the activations read contiguously: a [groups, 16, 2] tile of
    x (element 2j + t of a group is byte j's nibble t), each weight byte broadcast over its
    two nibbles (shifts 0 and 4), so the loads of x are wide instead of two strided ones."""
    groups = K // 32
    acc = tl.zeros([BLOCK_N, BLOCK_G], tl.float32)
    j = tl.arange(0, 16)
    t = tl.arange(0, 2)
    for g0 in range(0, groups, BLOCK_G):
        g = g0 + tl.arange(0, BLOCK_G)
        gmask = g < groups
        byte = g[:, None] * 16 + j[None, :]  # [G, 16] byte index in the row
        col = 2 * byte[:, :, None] + t[None, None, :]  # [G, 16, 2] value index
        x = tl.load(x_ptr + col, mask=gmask[:, None, None], other=0.0).to(tl.float32) * X_SCALE
        wmask = nmask[:, None] & gmask[None, :]
        w = tl.load(b_ptr + n[:, None, None].to(tl.int64) * (K // 2) + byte[None, :, :],
                    mask=wmask[:, :, None], other=0).to(tl.int32)  # fmt: skip
        v = e2m1_bits(w[:, :, :, None] >> (4 * t)[None, None, None, :], False)
        part = tl.sum(tl.sum(v * x[None, :, :, :], 3), 2)
        code = tl.load(s_ptr + n[:, None].to(tl.int64) * groups + g[None, :], mask=wmask,
                       other=0)  # fmt: skip
        acc += part * e8m0_shifted(code.to(tl.int32))
    return tl.sum(acc, 1)


@triton.jit
def dense_rows_dot(x_ptr, w_ptr, n, nmask, K, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """float32 `W[n, :] @ x` for a tile of rows `n` of a row-major [N, K] matrix."""
    acc = tl.zeros([BLOCK_N, BLOCK_K], tl.float32)
    for k0 in range(0, K, BLOCK_K):
        k = k0 + tl.arange(0, BLOCK_K)
        kmask = k < K
        x = tl.load(x_ptr + k, mask=kmask, other=0.0).to(tl.float32)
        w = tl.load(w_ptr + n[:, None].to(tl.int64) * K + k[None, :],
                    mask=nmask[:, None] & kmask[None, :], other=0.0)  # fmt: skip
        acc += w.to(tl.float32) * x[None, :]
    return tl.sum(acc, 1)


@triton.jit
def _fp8_rows_dot_blocks(x_ptr, w_ptr, s_ptr, n, nmask, K, QN: tl.constexpr, QK: tl.constexpr,
                         BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):  # fmt: skip
    """`fp8_rows_dot` with K tiles of several scale blocks: a [rows, blocks, QK] tile, each
    block's scale broadcast over its QK columns (wide tiles keep many bytes in flight when
    the scale block is narrow, as DeepSeek / Qwen3's 128 is)."""
    G: tl.constexpr = BLOCK_K // QK
    acc = tl.zeros([BLOCK_N, G, QK], tl.float32)
    sk = tl.cdiv(K, QK)
    scale_row = s_ptr + (n // QN) * sk
    j = tl.arange(0, QK)
    for k0 in range(0, K, BLOCK_K):
        blk = k0 // QK + tl.arange(0, G)
        k = blk[:, None] * QK + j[None, :]  # [G, QK]
        kmask = k < K
        x = tl.load(x_ptr + k, mask=kmask, other=0.0).to(tl.float32)
        w = tl.load(w_ptr + n[:, None, None].to(tl.int64) * K + k[None, :, :],
                    mask=nmask[:, None, None] & kmask[None, :, :], other=0.0)  # fmt: skip
        s = tl.load(scale_row[:, None] + blk[None, :], mask=nmask[:, None] & (blk < sk)[None, :],
                    other=0.0)  # fmt: skip
        acc += w.to(tl.float32) * (x[None, :, :] * s[:, :, None])
    return tl.sum(tl.sum(acc, 2), 1)


@triton.jit
def fp8_rows_dot(x_ptr, w_ptr, s_ptr, n, nmask, K, QN: tl.constexpr, QK: tl.constexpr,
                 BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):  # fmt: skip
    """float32 `W[n, :] @ x` for rows `n` of one e4m3 [N, K] matrix with scales at `s_ptr`:
    `QK` 0 (`gemv_qk`: the block spans K, per-channel / per-tensor) one scale per `QN` rows,
    [cdiv(N, QN)]; else [cdiv(N, QN), cdiv(K, QK)], a K tile inside one scale block or
    spanning whole ones (`BLOCK_K` a multiple of a power-of-two `QK`). Every branch is
    decided at compile time, so no tile shape of another branch is ever built."""
    if QK == 0:
        y = dense_rows_dot(x_ptr, w_ptr, n, nmask, K, BLOCK_N, BLOCK_K)
        y = y * tl.load(s_ptr + n // QN, mask=nmask, other=0.0)
    elif BLOCK_K > QK:
        y = _fp8_rows_dot_blocks(x_ptr, w_ptr, s_ptr, n, nmask, K, QN, QK, BLOCK_N, BLOCK_K)
    else:
        acc = tl.zeros([BLOCK_N, BLOCK_K], tl.float32)
        scale_row = s_ptr + (n // QN) * tl.cdiv(K, QK)
        for k0 in range(0, K, BLOCK_K):
            k = k0 + tl.arange(0, BLOCK_K)
            kmask = k < K
            x = tl.load(x_ptr + k, mask=kmask, other=0.0).to(tl.float32)
            w = tl.load(w_ptr + n[:, None].to(tl.int64) * K + k[None, :],
                        mask=nmask[:, None] & kmask[None, :], other=0.0)  # fmt: skip
            # measured faster on the H200 than a per-block reduction in the loop
            s = tl.load(scale_row + k0 // QK, mask=nmask, other=0.0)
            acc += w.to(tl.float32) * (x[None, :] * s[:, None])
        y = tl.sum(acc, 1)
    return y


def gemv_qk(qk: int, k: int) -> int:
    """`fp8_rows_dot`'s QK for a scale block `qk` columns wide over K: 0 where one block
    spans K (one scale per row group)."""
    return 0 if qk >= k else qk


# `e2m1_to_bf16`'s PTX: four bytes in $2, four bf16 out in $0 (elements 0, 1) and $1 (2, 3).
E2M1_HIGH_ASM = tl.constexpr("""
        {
        .reg .b32 a<2>, t<2>, c;
        prmt.b32 a0, 0, $2, 0x5040;
        prmt.b32 a1, 0, $2, 0x7060;
        shr.b32 t0, a0, 6;
        shr.b32 t1, a1, 6;
        and.b32 t0, t0, 0x01c001c0;
        and.b32 t1, t1, 0x01c001c0;
        and.b32 a0, a0, 0x80008000;
        and.b32 a1, a1, 0x80008000;
        or.b32 t0, t0, a0;
        or.b32 t1, t1, a1;
        mov.b32 c, 0x7e807e80;
        mul.rn.bf16x2 $0, t0, c;
        mul.rn.bf16x2 $1, t1, c;
        }
        """)
E2M1_LOW_ASM = tl.constexpr("""
        {
        .reg .b32 a<2>, s<2>, t<2>, c;
        prmt.b32 a0, 0, $2, 0x5040;
        prmt.b32 a1, 0, $2, 0x7060;
        shr.b32 t0, a0, 2;
        shr.b32 t1, a1, 2;
        and.b32 t0, t0, 0x01c001c0;
        and.b32 t1, t1, 0x01c001c0;
        shl.b32 s0, a0, 4;
        shl.b32 s1, a1, 4;
        and.b32 s0, s0, 0x80008000;
        and.b32 s1, s1, 0x80008000;
        or.b32 t0, t0, s0;
        or.b32 t1, t1, s1;
        mov.b32 c, 0x7e807e80;
        mul.rn.bf16x2 $0, t0, c;
        mul.rn.bf16x2 $1, t1, c;
        }
        """)


@triton.jit
def e2m1_to_bf16(b, HIGH: tl.constexpr):
    """The low (or HIGH) e2m1 nibbles of uint8 bytes `b` as exact bf16 values (compiled code
    only: inline assembly). Each byte goes to the top of a 16-bit lane (`prmt`), the nibble's
    sign to bit 15 and its three magnitude bits to bits 8..6, which reads as a bf16 of value
    `e2m1 * 2 ** -126` (`e2m1_bits`'s layout, 16 bits wide), and one bf16x2 multiply by
    2 ** 126 restores it: about three integer operations per weight, four weights a call."""
    if HIGH:
        y = tl.inline_asm_elementwise(asm=E2M1_HIGH_ASM, constraints="=r,=r,r", args=[b],
                                      dtype=tl.bfloat16, is_pure=True, pack=4)  # fmt: skip
    else:
        y = tl.inline_asm_elementwise(asm=E2M1_LOW_ASM, constraints="=r,=r,r", args=[b],
                                      dtype=tl.bfloat16, is_pure=True, pack=4)  # fmt: skip
    return y


@triton.jit
def _mxfp4_rows_tc(x_ptr, b_ptr, s_ptr, n, nmask, K, BLOCK_N: tl.constexpr,
                   BLOCK_G: tl.constexpr):  # fmt: skip
    """`_mxfp4_rows_regs` on the tensor cores: per group of 32, the low and the high nibbles
    of a [rows, 16 bytes] tile, decoded to x's dtype (bf16: `e2m1_to_bf16`), are two K-16
    dots with the even and the odd activations (the row padded to 16 columns of zeros, the
    weights as the MMA's row operand), summed in float32 and scaled once per group."""
    groups = K // 32
    acc = tl.zeros([BLOCK_N, 16], tl.float32)
    j = tl.arange(0, 16)
    first = (tl.arange(0, 16) == 0)[None, :]
    x_col = tl.zeros([1, 16], tl.int32)
    rows = b_ptr + n[:, None].to(tl.int64) * (K // 2)
    for g0 in range(0, groups, BLOCK_G):
        for gi in tl.static_range(BLOCK_G):
            # A group past K re-reads the last one (in bounds, in cache) and counts for 0:
            # masks constant along each row's 16 bytes keep the weight loads 16 bytes wide.
            g = tl.minimum(g0 + gi, groups - 1)
            counts = ((g0 + gi) < groups).to(tl.float32)
            byte = g * 16 + j
            w = tl.load(rows + byte[None, :], mask=nmask[:, None], other=0)
            x_even = tl.load(x_ptr + 2 * byte[:, None] + x_col, mask=first, other=0.0)
            x_odd = tl.load(x_ptr + 2 * byte[:, None] + 1 + x_col, mask=first, other=0.0)
            if x_ptr.dtype.element_ty == tl.bfloat16 and not INTERPRETED:
                low = e2m1_to_bf16(w, False)
                high = e2m1_to_bf16(w, True)
            else:
                code = w.to(tl.int32)
                low = (e2m1_x4(code & 15) * 0.25).to(x_ptr.dtype.element_ty)
                high = (e2m1_x4(code >> 4) * 0.25).to(x_ptr.dtype.element_ty)
            if x_ptr.dtype.element_ty == tl.float32:
                part = tl.dot(low, x_even, input_precision="ieee")
                part = tl.dot(high, x_odd, part, input_precision="ieee")
            else:
                part = tl.dot(low, x_even)
                part = tl.dot(high, x_odd, part)
            code = tl.load(s_ptr + n.to(tl.int64) * groups + g, mask=nmask, other=0)
            scale = (code.to(tl.int32) << 23).to(tl.float32, bitcast=True) * counts
            acc += part * scale[:, None]
    return tl.sum(acc, 1)


# Weight formats of the GEMV kernels (`W_FMT`, a compile-time parameter; `rows_dot` tests the
# numbers themselves).
DENSE = 0
FP8 = 1
MXFP4 = 2  # decoded in registers
MXFP4_DOT = 3  # through tl.dot_scaled (DOT_FMT: "bf16" / "fp16")
# Decoded in registers with the activations read contiguously (`_mxfp4_rows_pairs`): exact
# on the CPU interpreter, not yet timed on the GPU (MXFP4, timed on the H200 at ~0.7-0.9 TB/s
# of MXFP4 bytes, integer-bound, is the default): compare with `resin bench tune-gemv`.
MXFP4_PAIRS = 4
# Decoded in registers to x's dtype and multiplied on the tensor cores, the row padded to 16
# (`_mxfp4_rows_tc`; `GemvTiles.tensor_core` picks it).
MXFP4_TC = 5


@triton.jit
def expert_matrix(w_ptr, s_ptr, e, N, K, W_FMT: tl.constexpr, QN: tl.constexpr,
                  QK: tl.constexpr):  # fmt: skip
    """Pointers to expert `e`'s values and scales in a stack of [N, K] matrices of format
    `W_FMT` (FP8: `QK` 0, one scale per QN rows)."""
    if W_FMT == 0:
        w_e, s_e = w_ptr + e * N * K, s_ptr
    elif W_FMT == 1:
        per_expert = tl.cdiv(N, QN)
        if QK != 0:
            per_expert = per_expert * tl.cdiv(K, QK)
        w_e, s_e = w_ptr + e * N * K, s_ptr + e * per_expert
    else:
        w_e, s_e = w_ptr + e * N * (K // 2), s_ptr + e * N * (K // 32)
    return w_e, s_e


@triton.jit
def rows_dot(x_ptr, w_ptr, s_ptr, n, nmask, K, W_FMT: tl.constexpr, DOT_FMT: tl.constexpr,
             QN: tl.constexpr, QK: tl.constexpr, BLOCK_N: tl.constexpr,
             BLOCK_K: tl.constexpr):  # fmt: skip
    """float32 `W[n, :] @ x` for rows `n` of one matrix in format `W_FMT`: the only part of
    a GEMV that depends on how the weights are stored (`w_ptr`, `s_ptr`: that matrix's
    values and scales)."""
    if W_FMT == 0:
        y = dense_rows_dot(x_ptr, w_ptr, n, nmask, K, BLOCK_N, BLOCK_K)
    elif W_FMT == 1:
        y = fp8_rows_dot(x_ptr, w_ptr, s_ptr, n, nmask, K, QN, QK, BLOCK_N, BLOCK_K)
    elif W_FMT == 2:
        y = _mxfp4_rows_regs(x_ptr, w_ptr, s_ptr, n, nmask, K, BLOCK_N, BLOCK_K // 32)
    elif W_FMT == 4:
        y = _mxfp4_rows_pairs(x_ptr, w_ptr, s_ptr, n, nmask, K, BLOCK_N, BLOCK_K // 32)
    elif W_FMT == 5:
        y = _mxfp4_rows_tc(x_ptr, w_ptr, s_ptr, n, nmask, K, BLOCK_N, BLOCK_K // 32)
    else:
        y = _mxfp4_rows_dot_scaled(x_ptr, w_ptr, s_ptr, n, nmask, K, DOT_FMT, True, BLOCK_N,
                                   BLOCK_K // 32)  # fmt: skip
    return y


@triton.jit
def _mxfp4_rows_dot_scaled(x_ptr, b_ptr, s_ptr, n, nmask, K, FMT: tl.constexpr, FAST: tl.constexpr,
                           BLOCK_N: tl.constexpr, BLOCK_G: tl.constexpr):  # fmt: skip
    """`_mxfp4_rows_regs` on the tensor cores: `tl.dot_scaled` of the row (padded to 16 rows
    of zeros) with the packed e2m1 tile and its e8m0 scales (bf16 / fp16 `x`)."""
    acc = tl.zeros([16, BLOCK_N], tl.float32)
    first = tl.arange(0, 16)[:, None] == 0
    for g0 in range(0, K // 32, BLOCK_G):
        k = g0 * 32 + tl.arange(0, BLOCK_G * 32)
        x = tl.load(x_ptr + k[None, :] + tl.zeros([16, 1], tl.int32), mask=first & (k < K)[None, :],
                    other=0.0)  # fmt: skip
        w, scale = mxfp4_packed_tile(b_ptr, s_ptr, n, nmask, g0, K, BLOCK_G)
        acc = tl.dot_scaled(x, None, FMT, w, scale, "e2m1", acc, fast_math=FAST)
    return tl.sum(acc, 0)


@triton.jit
def mxfp4_packed_tile(b_ptr, s_ptr, n, nmask, g0, K, BLOCK_G: tl.constexpr):
    """`tl.dot_scaled`'s weight operands for rows `n` of one MXFP4 matrix (bytes [N, K / 2],
    scales [N, K / 32]) over `BLOCK_G` groups from group `g0`: the packed bytes
    [BLOCK_G * 16, rows] and their e8m0 scales [rows, BLOCK_G]."""
    byte = g0 * 16 + tl.arange(0, BLOCK_G * 16)
    g = g0 + tl.arange(0, BLOCK_G)
    w = tl.load(b_ptr + n[None, :].to(tl.int64) * (K // 2) + byte[:, None],
                mask=nmask[None, :] & (byte < K // 2)[:, None], other=0)  # fmt: skip
    scale = tl.load(s_ptr + n[:, None].to(tl.int64) * (K // 32) + g[None, :],
                    mask=nmask[:, None] & (g < K // 32)[None, :], other=0)  # fmt: skip
    return w, scale


@triton.jit
def mxfp4_tile(b_e, s_e, n, nmask, g0, K, BLOCK_N: tl.constexpr, BLOCK_G: tl.constexpr,
               HIGH: tl.constexpr):  # fmt: skip
    """One nibble of a [BLOCK_G * 16, BLOCK_N] weight tile (columns 2j or 2j + 1 of the K
    tile starting at group g0), dequantized to float32."""
    groups = K // 32
    g = g0 + tl.arange(0, BLOCK_G)
    gmask = g < groups
    byte = g[:, None] * 16 + tl.arange(0, 16)[None, :]  # [G, 16]
    mask = gmask[:, None, None] & nmask[None, None, :]
    w = tl.load(b_e + n[None, None, :].to(tl.int64) * (K // 2) + byte[:, :, None], mask=mask,
                other=0).to(tl.int32)  # fmt: skip
    if HIGH:
        w = w >> 4
    w = e2m1_x4(w & 15)
    code = tl.load(s_e + n[None, :].to(tl.int64) * groups + g[:, None],
                   mask=gmask[:, None] & nmask[None, :], other=0)  # fmt: skip
    w = w * e8m0_quarter(code.to(tl.int32))[:, None, :]
    return tl.reshape(w, [BLOCK_G * 16, BLOCK_N])
