"""Quantized checkpoints as published: the quantizer writes each format's layout and config
(round trip within the format's error bound), the reference runner dequantizes them exactly at
load, unsupported ones fail at startup naming what, and DeepSeek-style routers keep float32."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from resin_app.quantize import main as quantize_main
from resin_model.hf_config import load_config, parse_config
from resin_model.presets import TINY
from resin_model.quant import dequantize_fp8, dequantize_mxfp4
from resin_model.quant_config import UnsupportedQuantization
from resin_models_torch.registry import load_model
from tests.models.quant_folders import quantized_folder, source_folder


def _fp8_bound(x: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    return 2**-4 * x.abs() + 2**-10 * scale


@pytest.mark.parametrize("fmt", ["fp8-block", "fp8-channel"])
def test_fp8_formats_round_trip_within_their_bound(tmp_path: Path, fmt: str) -> None:
    src, dst = quantized_folder(TINY["qwen3_moe"], tmp_path, fmt)
    before, after = load_file(src / "model.safetensors"), load_file(dst / "model.safetensors")
    scale_suffix = "weight_scale_inv" if fmt == "fp8-block" else "weight_scale"
    quantized = [n for n, t in after.items() if t.dtype == torch.float8_e4m3fn]
    assert "model.layers.0.self_attn.q_proj.weight" in quantized
    assert "model.layers.0.mlp.experts.3.down_proj.weight" in quantized
    for kept in ("model.layers.0.mlp.gate.weight", "model.embed_tokens.weight", "lm_head.weight"):
        assert after[kept].dtype == torch.float32 and torch.equal(after[kept], before[kept])
    for name in quantized:
        scale = after[name[: -len("weight")] + scale_suffix]
        n, k = after[name].shape
        block = (128, 128) if fmt == "fp8-block" else (1, k)
        assert scale.dtype == torch.float32 and scale.shape == (
            -(-n // block[0]),
            -(-k // block[1]),
        )
        x = before[name]
        full_scale = dequantize_fp8(torch.ones_like(x).to(torch.float8_e4m3fn), scale, block)
        err = (dequantize_fp8(after[name], scale, block) - x).abs()
        assert (err <= _fp8_bound(x, full_scale)).all(), name
    config = load_config(dst)
    assert config.quant is not None
    assert config.quant.scheme == ("fp8_block" if fmt == "fp8-block" else "fp8_channel")


def test_mxfp4_round_trip_and_gpt_oss_layout(tmp_path: Path) -> None:
    src, dst = quantized_folder(TINY["gpt_oss"], tmp_path, "mxfp4")
    before, after = load_file(src / "model.safetensors"), load_file(dst / "model.safetensors")
    name = "model.layers.0.mlp.experts.gate_up_proj"
    assert name not in after and after[name + "_blocks"].dtype == torch.uint8
    e, h, two_i = before[name].shape
    assert after[name + "_blocks"].shape == (e, two_i, h // 32, 16)
    assert after[name + "_scales"].shape == (e, two_i, h // 32)
    w = before[name].transpose(1, 2)  # the stored rows are output channels
    got = dequantize_mxfp4(after[name + "_blocks"], after[name + "_scales"])
    scale = torch.exp2(after[name + "_scales"].float() - 127).repeat_interleave(32, dim=-1)
    assert ((got - w).abs() <= torch.maximum(w.abs(), scale) / 4).all()
    assert after["model.layers.0.self_attn.q_proj.weight"].dtype == torch.float32
    assert load_config(dst).quant is not None


@pytest.mark.parametrize(("arch", "fmt"), [("llama", "fp8-channel"), ("gpt_oss", "mxfp4"),
                                           ("qwen3_moe", "fp8-block")])  # fmt: skip
def test_reference_loads_the_exact_dequantized_weights(tmp_path: Path, arch: str, fmt: str) -> None:
    _, dst = quantized_folder(TINY[arch], tmp_path, fmt)
    stored = load_file(dst / "model.safetensors")
    params = dict(load_model(dst).named_parameters())
    quant = load_config(dst).quant
    assert quant is not None
    if fmt == "mxfp4":
        name = "model.layers.1.mlp.experts.down_proj"
        blocks, scales = stored[name + "_blocks"], stored[name + "_scales"]
        assert torch.equal(params[name], dequantize_mxfp4(blocks, scales).transpose(1, 2))
        return
    name = "model.layers.1.self_attn.o_proj.weight"
    scale = stored[name[: -len("weight")] + quant.scale_name]
    block = quant.weight_block(*stored[name].shape)
    assert torch.equal(params[name], dequantize_fp8(stored[name], scale, block))


def test_unsupported_quantization_fails_at_startup_naming_it(tmp_path: Path) -> None:
    raw = TINY["llama"]
    with pytest.raises(UnsupportedQuantization, match="quant_method 'awq'"):
        parse_config({**raw, "quantization_config": {"quant_method": "awq", "bits": 4}})
    with pytest.raises(UnsupportedQuantization, match="fmt='e5m2'"):
        parse_config({**raw, "quantization_config": {"quant_method": "fp8", "fmt": "e5m2",
                                                     "weight_block_size": [128, 128]}})  # fmt: skip
    src = source_folder(raw, tmp_path / "src")
    assert quantize_main([str(src), str(tmp_path / "x"), "--format", "mxfp4"]) == 2  # not gpt-oss
    _, dst = quantized_folder(raw, tmp_path / "q", "fp8-block")
    tensors = load_file(dst / "model.safetensors")
    del tensors["model.layers.0.mlp.down_proj.weight_scale_inv"]
    from safetensors.torch import save_file

    save_file(tensors, str(dst / "model.safetensors"))
    with pytest.raises(ValueError, match=r"without their partner.*mlp\.down_proj\.weight"):
        load_model(dst)


def test_nested_rope_parameters_are_checked() -> None:
    raw = {**TINY["llama"], "rope_parameters": {"rope_type": "default", "rope_theta": 1e4,
                                                "partial_rotary_factor": 0.5}}  # fmt: skip
    with pytest.raises(ValueError, match=r"rope_parameters.partial_rotary_factor=0.5"):
        parse_config(raw)
    raw["rope_parameters"] = {"rope_type": "default", "rope_theta": 1e4, "mrope_interleaved": 1}
    with pytest.raises(ValueError, match="mrope_interleaved"):
        parse_config(raw)
    raw["rope_parameters"] = {
        "rope_type": "default",
        "rope_theta": 1e4,
        "partial_rotary_factor": 1.0,
    }
    assert parse_config(raw).rope.theta == 1e4


def test_deepseek_router_stays_float32_and_picks_what_float32_picks() -> None:
    """Expert 0's float32 correction bias lifts it above experts 1 and 2 by less than bf16
    resolves near 1: rounded to bf16, experts 1 and 2 win. The bf16 model keeps the bias (and
    the router weight) in float32 and picks float32's experts, as transformers does."""
    from resin_model.expert_routing import deepseek_route
    from resin_models_torch.deepseek import DeepseekRouter
    from resin_models_torch.registry import build_model

    config = parse_config(_v3_tiny())
    assert config.moe is not None
    model = build_model(config, dtype=torch.bfloat16)
    router = next(m for m in model.modules() if isinstance(m, DeepseekRouter))
    bias = router.e_score_correction_bias
    assert bias is not None and bias.dtype == router.weight.dtype == torch.float32
    logits = torch.tensor([0.0, 2**-8, 2**-9, 0.0])  # scores 0.5, ~0.5 + 2**-10, ~0.5 + 2**-11
    with torch.no_grad():
        router.weight.copy_(logits[:, None].expand(4, config.hidden_size) / config.hidden_size)
        bias.copy_(torch.tensor([1.0 + 2**-9, 1.0, 1.0, -1.0]))
    _, chosen = router(torch.ones(1, config.hidden_size, dtype=torch.bfloat16))
    assert sorted(chosen[0].tolist()) == [0, 1]
    rounded = bias.detach().to(torch.bfloat16).float()
    _, rounded_choice = deepseek_route(logits[None], rounded, config.moe)
    assert sorted(rounded_choice[0].tolist()) == [1, 2]  # what bf16 rounding would pick


def _v3_tiny() -> dict[str, object]:
    return {
        **TINY["llama"], "model_type": "deepseek_v3", "kv_lora_rank": 32, "q_lora_rank": None,
        "qk_rope_head_dim": 8, "qk_nope_head_dim": 16, "v_head_dim": 16, "n_routed_experts": 4,
        "num_experts_per_tok": 2, "n_group": 1, "topk_group": 1, "moe_intermediate_size": 32,
        "first_k_dense_replace": 1, "n_shared_experts": 1, "routed_scaling_factor": 1.0,
    }  # fmt: skip


def test_weight_bytes_count_the_stored_format() -> None:
    """The runner benchmark's bandwidth fraction uses the bytes a quantized model reads."""
    from dataclasses import replace

    from resin_model.config import ModelConfig
    from resin_model.presets import preset, weight_bytes_read
    from resin_model.quant_checkpoint import QuantFormat, quantization_config
    from resin_model.quant_config import parse_quant_config

    def quantized(name: str, fmt: QuantFormat) -> ModelConfig:
        return replace(preset(name), quant=parse_quant_config(quantization_config(fmt)))

    llama = preset("llama-8b")
    head = llama.vocab_size * llama.hidden_size * 2  # the untied LM head stays bf16
    fp8 = weight_bytes_read(quantized("llama-8b", "fp8-channel"), 1)
    assert fp8 == (weight_bytes_read(llama, 1) - head) // 2 + head
    mxfp4 = weight_bytes_read(quantized("gpt-oss-20b", "mxfp4"), 64)
    assert mxfp4 < weight_bytes_read(preset("gpt-oss-20b"), 64) / 3


def test_stored_bytes_of_the_published_checkpoints() -> None:
    """`checkpoint_bytes`, what a model built on one device should hold: the published
    checkpoints' sizes (gpt-oss-120b's 36 layers of 128 MXFP4 experts ~65 GB, which one
    H200 holds; GLM-4.5-Air-FP8 ~108 GB; Llama-3.1-8B bf16 ~16 GB)."""
    from dataclasses import replace

    from resin_model.presets import checkpoint_bytes, preset
    from resin_model.quant_checkpoint import quantization_config
    from resin_model.quant_config import parse_quant_config

    big = preset("gpt-oss-120b")
    assert (big.num_layers, big.moe.num_experts, big.moe.top_k) == (36, 128, 4)  # type: ignore[union-attr]
    mxfp4 = parse_quant_config(quantization_config("mxfp4"))
    assert 63e9 < checkpoint_bytes(replace(big, quant=mxfp4)) < 67e9
    fp8 = parse_quant_config(quantization_config("fp8-block"))
    assert 105e9 < checkpoint_bytes(replace(preset("glm-4.5-air"), quant=fp8)) < 111e9
    assert 15.5e9 < checkpoint_bytes(preset("llama-8b")) < 16.5e9
