"""Quantized formats' math (`resin_model.quant`): known values of e2m1 / e8m0 / e4m3, round
trips within each format's error bound over odd shapes, the MXFP4 layout transformers reads
(gpt-oss), and `quantization_config` parsing with its errors."""

from __future__ import annotations

import math

import pytest
import torch

from resin_model.quant import (
    E2M1_VALUES,
    FP8_MAX,
    QuantConfig,
    UnsupportedQuantization,
    dequantize_fp8,
    dequantize_mxfp4,
    e8m0_to_float,
    parse_quant_config,
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


# ---------------------------------------------------------------------------------------------
# quantization_config

QWEN3_FP8 = {
    "activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8",
    "weight_block_size": [128, 128],
    "modules_to_not_convert": ["lm_head", "model.layers.0.mlp.gate"],
}  # fmt: skip
LLAMA_FP8_DYNAMIC = {
    "quant_method": "compressed-tensors", "format": "float-quantized",
    "quantization_status": "compressed", "global_compression_ratio": 1.46, "ignore": ["lm_head"],
    "kv_cache_scheme": None,
    "config_groups": {"group_0": {
        "targets": ["Linear"], "output_activations": None,
        "weights": {"num_bits": 8, "type": "float", "symmetric": True, "strategy": "channel",
                    "dynamic": False, "group_size": None, "block_structure": None,
                    "actorder": None, "observer": "minmax", "observer_kwargs": {}},
        "input_activations": {"num_bits": 8, "type": "float", "symmetric": True,
                              "strategy": "token", "dynamic": True, "group_size": None,
                              "block_structure": None, "actorder": None, "observer": None,
                              "observer_kwargs": {}},
    }},
}  # fmt: skip
GPT_OSS = {
    "quant_method": "mxfp4",
    "modules_to_not_convert": ["model.layers.*.self_attn", "model.layers.*.mlp.router",
                               "model.embed_tokens", "lm_head"],
}  # fmt: skip


def test_parses_the_published_configs() -> None:
    assert parse_quant_config(None) is None
    qwen = parse_quant_config(QWEN3_FP8)
    assert qwen == QuantConfig("fp8_block", "dynamic_group", "weight_scale_inv", (128, 128), 128,
                               qwen.skip)  # fmt: skip
    assert qwen.weight_block(4096, 2048) == (128, 128)
    assert not qwen.quantizes("lm_head") and not qwen.quantizes("model.layers.0.mlp.gate")
    assert qwen.quantizes("model.layers.0.mlp.gate_proj")
    assert qwen.quantizes("model.layers.10.mlp.gate")

    llama = parse_quant_config(LLAMA_FP8_DYNAMIC)
    assert llama is not None
    assert (llama.scheme, llama.activations, llama.scale_name) == (
        "fp8_channel",
        "dynamic_token",
        "weight_scale",
    )
    assert llama.weight_block(4096, 14336) == (1, 14336)
    assert not llama.quantizes("lm_head") and llama.quantizes("model.layers.3.mlp.down_proj")

    oss = parse_quant_config(GPT_OSS)
    assert oss is not None and oss.scheme == "mxfp4" and oss.scale_name == "scales"
    assert not oss.quantizes("model.layers.11.self_attn.q_proj")
    assert not oss.quantizes("model.layers.0.mlp.router")
    assert oss.quantizes("model.layers.0.mlp.experts")


def _ct(**changes: object) -> dict:
    raw = {**LLAMA_FP8_DYNAMIC, "config_groups": {"group_0": {
        **LLAMA_FP8_DYNAMIC["config_groups"]["group_0"]}}}  # type: ignore[index]  # fmt: skip
    group = raw["config_groups"]["group_0"]
    for key, value in changes.items():
        where, _, field = key.partition("__")
        if where == "top":
            raw[field] = value
        elif where == "group":
            group[field] = value
        else:
            group[where] = {**group[where], field: value}
    return raw


def test_compressed_tensors_variants() -> None:
    static = parse_quant_config(_ct(input_activations__strategy="tensor",
                                    input_activations__dynamic=False))  # fmt: skip
    assert static is not None and static.activations == "static_tensor"
    tensor = parse_quant_config(_ct(weights__strategy="tensor"))
    assert tensor is not None and tensor.weight_block(30, 40) == (30, 40)
    block = parse_quant_config(_ct(weights__strategy="block", weights__block_structure=[128, 128],
                                   input_activations__strategy="group",
                                   input_activations__group_size=128))  # fmt: skip
    assert block is not None and (block.scheme, block.block, block.activation_group) == (
        "fp8_block",
        (128, 128),
        128,
    )
    weight_only = parse_quant_config(_ct(group__input_activations=None))
    assert weight_only is not None and weight_only.activations == "none"
    regex = parse_quant_config(_ct(top__ignore=["lm_head", "re:.*mlp.gate$"]))
    assert regex is not None and not regex.quantizes("model.layers.2.mlp.gate")
    assert regex.quantizes("model.layers.2.mlp.gate_proj")


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ({"quant_method": "awq", "bits": 4}, "quant_method 'awq' is not supported"),
        ({"bits": 4}, "quant_method None is not supported"),
        ({**QWEN3_FP8, "fmt": "e5m2"}, "fmt='e5m2'"),
        ({**QWEN3_FP8, "activation_scheme": "static"}, "activation_scheme='static'"),
        ({**QWEN3_FP8, "weight_block_size": [128]}, "weight_block_size=\\[128\\]"),
        ({k: v for k, v in QWEN3_FP8.items() if k != "weight_block_size"}, "no weight_block_size"),
        ({**QWEN3_FP8, "new_knob": 1}, "unknown keys \\['new_knob'\\]"),
        ({**GPT_OSS, "group_size": 16}, "unknown keys \\['group_size'\\]"),
        (_ct(top__format="pack-quantized"), "format='pack-quantized'"),
        (_ct(weights__type="int", weights__num_bits=4), "int 4-bit is not supported"),
        (_ct(weights__strategy="group"), "strategy='group'"),
        (_ct(input_activations__strategy="tensor"), "strategy='tensor' dynamic=True"),
        (_ct(top__kv_cache_scheme={"num_bits": 8}), "kv_cache_scheme="),
        (_ct(group__targets=["Attention"]), "targets="),
        (_ct(top__quantization_status="frozen"), "quantization_status='frozen'"),
        (_ct(weights__symmetric=False), "symmetric=False"),
    ],
)
def test_unsupported_configs_name_what(raw: dict, message: str) -> None:
    with pytest.raises(UnsupportedQuantization, match=message):
        parse_quant_config(raw)
