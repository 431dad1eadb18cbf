# mypy: disable-error-code="untyped-decorator,no-untyped-def"
"""In-register pieces of the quantized formats (`resin_model.quant` has their definitions),
shared by the FP8 and MXFP4 kernels:

- `fp8_quantize_rows`: one tile's rows to e4m3 with a scale per row (amax / 448), the dynamic
  activation quantization of block FP8 (a tile of 128 columns is one group); `to_fp8`: the
  saturating, round-to-nearest-even cast it ends with;
- `e2m1_x4`: an e2m1 code (0..15) as float32, times 4 (integer arithmetic, exact);
- `e8m0_quarter`: an e8m0 exponent as float32 `2 ** (code - 127) / 4`, by building its bits
  (codes 0..2 flush to 0: their true values are below 2**-125, far under any weight's scale).
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
