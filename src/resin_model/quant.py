"""Quantized checkpoint formats, read as published: their math in plain torch (which format a
checkpoint uses: `quant_config.py`).

Formats:
- **FP8 e4m3, block-scaled** (`quant_method: fp8` with `weight_block_size`: Qwen3-*-FP8,
  DeepSeek-V3): `weight` float8_e4m3fn [N, K] and `weight_scale_inv` float32
  [cdiv(N, bn), cdiv(K, bk)]; `W[n, k] = weight[n, k] * weight_scale_inv[n // bn, k // bk]`.
  Activations are quantized on the fly per token and group of `bk` columns.
- **FP8 e4m3, per-tensor or per-channel** (compressed-tensors `float-quantized`): `weight`
  and `weight_scale` ([] / [1] or [N, 1]); activations dynamic per token, or static per tensor
  (`input_scale`), or not quantized.
- **MXFP4** (OCP microscaling, gpt-oss experts): `<name>_blocks` uint8 [..., K / 32, 16] holds
  32 e2m1 values per block, two a byte (element 2j in the low nibble, 2j + 1 in the high one),
  and `<name>_scales` uint8 [..., K / 32] one e8m0 exponent per block:
  `W[..., k] = e2m1(k) * 2 ** (scales[..., k // 32] - 127)`.

Every FP8 granularity is one "scale block" `(qn, qk)` here: per-tensor is `(N, K)`,
per-channel `(1, K)`, per-token activations `(1, K)`, DeepSeek's blocks `(128, 128)`; a
tensor [..., N, K] carries float32 scales [..., cdiv(N, qn), cdiv(K, qk)] and the same two
functions quantize and dequantize them all.

Error bounds of the quantizers here (what the tests check), for `x` in a block of scale `s`:
- FP8 e4m3 (3 mantissa bits, rounding to nearest): `|x - dq(q(x))| <= 2**-4 * |x| + 2**-10 * s`
  (half an ulp of the normal range, half a subnormal step below it);
- MXFP4: the scale is the least power of two with `amax / s <= 6` (no value clips), so
  `|x - dq(q(x))| <= max(|x|, s) / 4`.
"""

from __future__ import annotations

import math

import torch

FP8_DTYPE = torch.float8_e4m3fn
FP8_MAX = 448.0  # largest finite e4m3 (fn: no infinities) value
_MIN_SCALE = 1e-12  # an all-zero block gets this scale (its values stay 0)

MXFP4_GROUP = 32  # values per e8m0 scale
E8M0_BIAS = 127
E8M0_NAN = 255
# e2m1 codes 0..15: sign bit 3, exponent bits 2..1 (bias 1), mantissa bit 0.
E2M1_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0,
               -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0)  # fmt: skip
E2M1_MAX = 6.0


# ---------------------------------------------------------------------------------------------
# FP8 e4m3


def _blocked(x: torch.Tensor, block: tuple[int, int]) -> torch.Tensor:
    """[..., N, K] -> [..., sn, qn, sk, qk] (zero padded to whole blocks)."""
    qn, qk = block
    n, k = x.shape[-2:]
    sn, sk = math.ceil(n / qn), math.ceil(k / qk)
    padded = torch.nn.functional.pad(x, (0, sk * qk - k, 0, sn * qn - n))
    return padded.reshape(*x.shape[:-2], sn, qn, sk, qk)


def _expand(scale: torch.Tensor, block: tuple[int, int], n: int, k: int) -> torch.Tensor:
    """Scales [..., sn, sk] -> one per element [..., n, k]."""
    qn, qk = block
    full = scale.repeat_interleave(qn, dim=-2).repeat_interleave(qk, dim=-1)
    return full[..., :n, :k]


def _check_block(block: tuple[int, int]) -> None:
    if len(block) != 2 or min(block) < 1:
        raise ValueError(f"an FP8 scale block is two positive sizes, got {block}")


def quantize_fp8(x: torch.Tensor, block: tuple[int, int]) -> tuple[torch.Tensor, torch.Tensor]:
    """`x` [..., N, K] -> (`q` float8_e4m3fn [..., N, K], `scale` float32
    [..., cdiv(N, qn), cdiv(K, qk)]) with `x ~= q * scale` per block: each block's scale is
    its largest magnitude over 448 (the scheme of DeepSeek-V3 and compressed-tensors)."""
    _check_block(block)
    if x.dim() < 2:
        raise ValueError(f"quantize_fp8 takes [..., N, K], got shape {tuple(x.shape)}")
    x32 = x.float()
    amax = _blocked(x32.abs(), block).amax(dim=(-3, -1))
    scale = (amax / FP8_MAX).clamp(min=_MIN_SCALE)
    n, k = x.shape[-2:]
    q = (x32 / _expand(scale, block, n, k)).clamp(-FP8_MAX, FP8_MAX).to(FP8_DTYPE)
    return q, scale


def dequantize_fp8(q: torch.Tensor, scale: torch.Tensor, block: tuple[int, int]) -> torch.Tensor:
    """float32 `q * scale` per block: `q` [..., N, K], `scale` [..., cdiv(N, qn), cdiv(K, qk)]
    (or the same number of values in another shape)."""
    _check_block(block)
    n, k = q.shape[-2:]
    want = (*q.shape[:-2], math.ceil(n / block[0]), math.ceil(k / block[1]))
    scale = scale.float()
    if scale.numel() == math.prod(want) and scale.dim() != len(want):
        scale = scale.reshape(want)  # a checkpoint's [] / [1] per-tensor or [N] per-channel
    if tuple(scale.shape) != want:
        raise ValueError(
            f"FP8 scale of shape {tuple(scale.shape)} does not fit weight {tuple(q.shape)} "
            f"in blocks {block}: expected {want}"
        )
    return q.float() * _expand(scale, block, n, k)


def quantize_fp8_activations(
    x: torch.Tensor, group: int | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Dynamic activation quantization: `x` [T, K] -> (fp8 [T, K], float32 scales
    [T, cdiv(K, group)]), one scale per token (`group=None`) or per token and `group` columns
    (block FP8's activations: group 128)."""
    return quantize_fp8(x, (1, x.shape[-1] if group is None else group))


# ---------------------------------------------------------------------------------------------
# MXFP4


def e8m0_to_float(codes: torch.Tensor) -> torch.Tensor:
    """e8m0 exponents (uint8) -> float32 `2 ** (code - 127)`; code 255 is NaN (OCP MX)."""
    exp = codes.to(torch.int32) - E8M0_BIAS
    value = torch.ldexp(torch.ones_like(exp, dtype=torch.float32), exp)
    return torch.where(codes.to(torch.int32) == E8M0_NAN, torch.nan, value)


def dequantize_mxfp4(blocks: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """`blocks` uint8 [..., G, 16] + `scales` uint8 [..., G] -> float32 [..., G * 32]."""
    if blocks.dtype != torch.uint8 or scales.dtype != torch.uint8:
        raise ValueError(f"MXFP4 blocks and scales are uint8, got {blocks.dtype}, {scales.dtype}")
    if blocks.shape[-1] != MXFP4_GROUP // 2 or blocks.shape[:-1] != scales.shape:
        raise ValueError(
            f"MXFP4 blocks {tuple(blocks.shape)} and scales {tuple(scales.shape)} do not pair: "
            f"expected blocks [..., G, 16] and scales [..., G]"
        )
    lut = torch.tensor(E2M1_VALUES, dtype=torch.float32, device=blocks.device)
    codes = torch.stack((blocks & 0x0F, blocks >> 4), dim=-1).long()  # [..., G, 16, 2]
    values = lut[codes].reshape(*scales.shape, MXFP4_GROUP)
    out = values * e8m0_to_float(scales)[..., None]
    return out.reshape(*scales.shape[:-1], scales.shape[-1] * MXFP4_GROUP)


def _e2m1_codes(v: torch.Tensor) -> torch.Tensor:
    """Nearest e2m1 code of each value of `v` (already scaled, |v| <= 6); ties to the even
    code, as hardware conversions round."""
    mags = torch.tensor(E2M1_VALUES[:8], dtype=torch.float32, device=v.device)
    mids = (mags[1:] + mags[:-1]) / 2
    a = v.abs()
    idx = torch.bucketize(a, mids)  # a == mid goes to the lower code
    tie_up = (idx < 7) & (a == mids[idx.clamp(max=6)]) & (idx % 2 == 1)
    idx = idx + tie_up.long()
    return (idx | torch.where(torch.signbit(v), 8, 0)).to(torch.uint8)


def quantize_mxfp4(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """`w` [..., K] (K a multiple of 32) -> (`blocks` uint8 [..., K / 32, 16], `scales` uint8
    [..., K / 32]): per 32 values the least power-of-two scale that keeps every value within
    e2m1's +-6, and each value rounded to its nearest e2m1."""
    k = w.shape[-1]
    if k % MXFP4_GROUP:
        raise ValueError(f"MXFP4 needs the last dimension a multiple of 32, got {k}")
    g = w.float().reshape(*w.shape[:-1], k // MXFP4_GROUP, MXFP4_GROUP)
    amax = g.abs().amax(dim=-1)
    exp = torch.ceil(torch.log2(amax / E2M1_MAX)).clamp(-E8M0_BIAS, E8M0_BIAS)
    exp = torch.where(amax > 0, exp, -E8M0_BIAS).to(torch.int32)
    scaled = g / torch.ldexp(torch.ones_like(amax), exp)[..., None]
    codes = _e2m1_codes(scaled.clamp(-E2M1_MAX, E2M1_MAX))
    pairs = codes.reshape(*codes.shape[:-1], MXFP4_GROUP // 2, 2)
    blocks = pairs[..., 0] | (pairs[..., 1] << 4)
    return blocks, (exp + E8M0_BIAS).to(torch.uint8)
