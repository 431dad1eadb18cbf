"""Quantized formats' math (`resin_model.quant`): known values of e2m1 / e8m0 / e4m3, round
trips within each format's error bound over odd shapes, and the MXFP4 layout transformers
reads (gpt-oss)."""

from __future__ import annotations

import math

import pytest
import torch

from resin_model.quant import (
    E2M1_VALUES,
    FP8_MAX,
    dequantize_fp8,
    dequantize_mxfp4,
    e8m0_to_float,
    quantize_fp8,
    quantize_fp8_activations,
    quantize_mxfp4,
)


def test_e8m0_codes_are_powers_of_two() -> None:
    codes = torch.tensor([0, 1, 126, 127, 128, 130, 254, 255], dtype=torch.uint8)
    got = e8m0_to_float(codes)
    expect = [2.0**-127, 2.0**-126, 0.5, 1.0, 2.0, 8.0, 2.0**127]
    assert got[:7].tolist() == expect
    assert math.isnan(got[7].item())


def test_mxfp4_nibbles_decode_to_the_e2m1_table() -> None:
    """Byte j of a block holds element 2j in its low nibble and 2j + 1 in its high one."""
    codes = torch.arange(32) % 16
    blocks = (codes[0::2] | (codes[1::2] << 4)).to(torch.uint8).reshape(1, 16)
    scale = torch.tensor([128], dtype=torch.uint8)  # x 2
    got = dequantize_mxfp4(blocks, scale)
    expect = torch.tensor([E2M1_VALUES[c] * 2 for c in codes.tolist()])
    assert got.shape == (32,) and torch.equal(got, expect)
    assert E2M1_VALUES[:8] == (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)


def test_mxfp4_matches_transformers_dequantization() -> None:
    """The gpt-oss layout as transformers reads it (its `convert_moe_packed_tensors` returns
    the expert matrices transposed, [E, K, N])."""
    mxfp4 = pytest.importorskip("transformers.integrations.mxfp4")
    torch.manual_seed(0)
    blocks = torch.randint(0, 256, (3, 5, 4, 16), dtype=torch.uint8)
    scales = torch.randint(118, 135, (3, 5, 4), dtype=torch.uint8)
    theirs = mxfp4.convert_moe_packed_tensors(blocks, scales, dtype=torch.float32)
    assert torch.equal(dequantize_mxfp4(blocks, scales), theirs.transpose(1, 2))


def test_mxfp4_rounds_to_nearest_with_ties_to_even() -> None:
    # Scale 1 (block max 6): each value lands on its nearest e2m1, ties to the even code.
    x = torch.tensor([6.0, 0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, -5.1, 0.3, -0.0, 2.9]
                     + [0.0] * 20)  # fmt: skip
    blocks, scales = quantize_mxfp4(x)
    assert scales.tolist() == [127]
    got = dequantize_mxfp4(blocks, scales)[:12].tolist()
    assert got == [6.0, 0.0, 1.0, 1.0, 2.0, 2.0, 4.0, 4.0, -6.0, 0.5, -0.0, 3.0]


@pytest.mark.parametrize("shape", [(1, 32), (7, 96), (3, 5, 160)])
@pytest.mark.parametrize("spread", [1e-3, 1.0, 300.0])
def test_mxfp4_round_trip_within_bound(shape: tuple[int, ...], spread: float) -> None:
    torch.manual_seed(len(shape))
    x = torch.randn(shape) * spread * torch.rand((*shape[:-1], 1)).add(0.1)
    blocks, scales = quantize_mxfp4(x)
    assert blocks.shape == (*shape[:-1], shape[-1] // 32, 16) and blocks.dtype == torch.uint8
    got = dequantize_mxfp4(blocks, scales)
    s = e8m0_to_float(scales).repeat_interleave(32, dim=-1)
    assert torch.all((got - x).abs() <= torch.maximum(x.abs(), s) / 4)
    # The scale is the least power of two that keeps the block's values within +-6.
    amax = x.reshape(*shape[:-1], -1, 32).abs().amax(-1)
    assert torch.all(amax <= 6 * e8m0_to_float(scales))
    assert torch.all(amax > 3 * e8m0_to_float(scales))


def test_mxfp4_zero_block_and_bad_shapes() -> None:
    blocks, scales = quantize_mxfp4(torch.zeros(2, 64))
    assert torch.equal(dequantize_mxfp4(blocks, scales), torch.zeros(2, 64))
    with pytest.raises(ValueError, match="multiple of 32"):
        quantize_mxfp4(torch.zeros(2, 40))
    with pytest.raises(ValueError, match="do not pair"):
        dequantize_mxfp4(blocks, scales[:, :1])


def _fp8_bound(x: torch.Tensor, scale_per_element: torch.Tensor) -> torch.Tensor:
    return 2.0**-4 * x.abs() + 2.0**-10 * scale_per_element


@pytest.mark.parametrize(
    ("shape", "block"),
    [((130, 200), (128, 128)), ((3, 33, 70), (16, 32)), ((17, 50), (1, 50)),
     ((9, 31), (9, 31)), ((5, 300), (1, 128))],
)  # fmt: skip
def test_fp8_round_trip_within_bound(shape: tuple[int, ...], block: tuple[int, int]) -> None:
    """Block, per-channel (1, K), per-tensor (N, K) and per-token-group scales."""
    torch.manual_seed(shape[-1])
    x = torch.randn(shape) * torch.rand((*shape[:-1], 1)).mul(50).add(1e-3)
    q, scale = quantize_fp8(x, block)
    n, k = shape[-2:]
    assert q.dtype == torch.float8_e4m3fn and q.shape == x.shape
    assert scale.shape == (*shape[:-2], math.ceil(n / block[0]), math.ceil(k / block[1]))
    got = dequantize_fp8(q, scale, block)
    s = scale.repeat_interleave(block[0], -2).repeat_interleave(block[1], -1)[..., :n, :k]
    assert torch.all((got - x).abs() <= _fp8_bound(x, s))
    assert q.float().abs().amax() <= FP8_MAX


def test_fp8_known_values_and_scale_shapes() -> None:
    x = torch.tensor([[448.0, -224.0, 1.0, 0.0]])
    q, scale = quantize_fp8(x, (1, 4))
    assert scale.tolist() == [[1.0]] and q.float().tolist() == [[448.0, -224.0, 1.0, 0.0]]
    # e4m3 near 1: steps of 1/8; 1.0625 is a tie and rounds to the even 1.0.
    q, _ = quantize_fp8(torch.tensor([[448.0, 1.0625, 1.07, 0.3]]), (1, 4))
    assert q.float().tolist() == [[448.0, 1.0, 1.125, 0.3125]]
    # Per-tensor scales as checkpoints store them ([] or [1]) and per-channel [N, 1].
    w = torch.randn(6, 10)
    q, scale = quantize_fp8(w, (6, 10))
    assert torch.equal(
        dequantize_fp8(q, scale.reshape(()), (6, 10)), dequantize_fp8(q, scale, (6, 10))
    )
    q, scale = quantize_fp8(w, (1, 10))
    assert scale.shape == (6, 1)
    with pytest.raises(ValueError, match="does not fit"):
        dequantize_fp8(q, scale[:3], (1, 10))
    zero_q, zero_s = quantize_fp8(torch.zeros(4, 8), (2, 8))
    assert torch.equal(dequantize_fp8(zero_q, zero_s, (2, 8)), torch.zeros(4, 8))


def test_activation_scales_per_token_and_group() -> None:
    x = torch.randn(5, 300)
    q, s = quantize_fp8_activations(x)
    assert s.shape == (5, 1)
    torch.testing.assert_close(s[:, 0], x.abs().amax(1) / FP8_MAX)
    assert torch.equal(dequantize_fp8(q, s, (1, 300)), q.float() * s)
    q, s = quantize_fp8_activations(x, 128)
    assert s.shape == (5, 3)
    torch.testing.assert_close(s[:, 2], x[:, 256:].abs().amax(1) / FP8_MAX)
    assert torch.equal(q[:, 256:].float() * s[:, 2:], dequantize_fp8(q, s, (1, 128))[:, 256:])
