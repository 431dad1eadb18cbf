"""`quantization_config` parsing (`resin_model.quant_config`): the published configs of
Qwen3-FP8, Llama-3.1-8B-Instruct-FP8-dynamic (compressed-tensors) and gpt-oss parse to the
expected `QuantConfig`, module skip rules match as transformers / compressed-tensors match
them, and every unsupported method, variant or unknown key raises naming it."""

from __future__ import annotations

import pytest

from resin_model.quant_config import QuantConfig, UnsupportedQuantization, parse_quant_config

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
