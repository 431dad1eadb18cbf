"""`config.json` (Hugging Face) -> `ModelConfig`: `load_config(folder)`, `parse_config(dict)`.

Every Hugging Face naming quirk (rope_parameters vs rope_theta/rope_scaling, num_experts vs
num_local_experts, LFM2's block_ff_dim arithmetic, Gemma's per-layer-type rope bases) is
resolved here, in one place. Defaults are the Hugging Face config classes' defaults. A key this
module does not read and does not know to be harmless (metadata, training-only knobs) raises:
an unknown field may change the math, and silently ignoring it would give wrong outputs.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from resin_model.config import ModelConfig, MoeConfig, RopeConfig
from resin_model.hf_deepseek import parse_deepseek
from resin_model.hf_deepseek_v4 import deepseek_v4_quant, parse_deepseek_v4
from resin_model.hf_glm import parse_glm4_moe
from resin_model.hf_glm5_next import parse_glm5_next, parse_glm5_next_text
from resin_model.hf_qwen3_5 import parse_qwen3_5_moe, parse_qwen3_5_moe_text
from resin_model.hf_reader import (
    Reader,
    common_fields,
    global_rope,
    layer_types,
    rope_config,
)
from resin_model.hf_vision_config import gemma3_vlm, qwen2_5_vl
from resin_model.quant_config import parse_quant_config


def load_config(folder: str | Path) -> ModelConfig:
    """Read `<folder>/config.json` and translate it."""
    path = Path(folder) / "config.json"
    if not path.is_file():
        raise FileNotFoundError(f"no config.json in {folder}")
    return parse_config(json.loads(path.read_text()))


def parse_config(raw: dict[str, Any]) -> ModelConfig:
    """Translate a Hugging Face config dict into a `ModelConfig` (raises on unsupported ones,
    and on keys that are neither read nor known to be harmless)."""
    model_type = str(raw.get("model_type", ""))
    if model_type not in _PARSERS:
        raise ValueError(f"unsupported model_type {model_type!r}; known: {sorted(_PARSERS)}")
    reader = Reader(raw)
    config = _PARSERS[model_type](reader)
    if model_type == "deepseek_v4":
        quant = deepseek_v4_quant(reader)
    else:
        quant = parse_quant_config(reader.get("quantization_config"))
    reader.check_all_read()
    return replace(config, quant=quant) if quant is not None else config


def _llama(raw: Reader) -> ModelConfig:
    model_type = str(raw.get("model_type"))
    common = common_fields(raw)
    window = raw.get("sliding_window")
    use_window = bool(raw.get("use_sliding_window", model_type == "mistral"))
    if model_type in ("qwen2", "qwen3", "qwen3_moe") and use_window:
        layers = raw.integer("max_window_layers", common["num_layers"], low=0)
        if layers < common["num_layers"]:
            raise ValueError("Qwen sliding window on only some layers is not supported")
    raw.get("max_window_layers")
    sliding = window is not None and use_window
    n = common["num_layers"]
    types = layer_types(raw, ["sliding_attention" if sliding else "full_attention"] * n)
    bias = bool(raw.get("attention_bias", False))
    return ModelConfig(
        **common,
        rope=global_rope(raw),
        layer_types=types,
        # Qwen2 hard-codes a q/k/v bias (and no o bias); Llama/Qwen3 follow attention_bias.
        qkv_bias=bias or model_type == "qwen2",
        o_bias=bias and model_type != "qwen2",
        mlp_bias=bool(raw.get("mlp_bias", False)),
        qk_norm=model_type in ("qwen3", "qwen3_moe"),
        sliding_window=int(window) if window and "sliding" in types else None,
    )


def _qwen3_moe(raw: Reader) -> ModelConfig:
    base = _llama(raw)
    experts, local_experts = raw.get("num_experts"), raw.get("num_local_experts")
    num_experts = int(experts or local_experts or 0)
    step = raw.integer("decoder_sparse_step", 1, low=0)
    dense = set(raw.get("mlp_only_layers") or [])
    sparse = tuple(
        i not in dense and num_experts > 0 and (i + 1) % step == 0 for i in range(base.num_layers)
    )
    moe = MoeConfig(
        num_experts=num_experts,
        top_k=raw.integer("num_experts_per_tok", low=0),
        intermediate_size=raw.integer("moe_intermediate_size", low=0),
        norm_topk_prob=bool(raw.get("norm_topk_prob", False)),
        sparse_layers=sparse,
    )
    return replace(base, moe=moe)


def _gpt_oss(raw: Reader) -> ModelConfig:
    common = common_fields(raw, eps=1e-5)
    common["max_positions"] = raw.integer("max_position_embeddings", 131072, low=0)
    n = common["num_layers"]
    default = ["sliding_attention" if (i + 1) % 2 else "full_attention" for i in range(n)]
    yarn = {"rope_type": "yarn", "factor": 32.0, "beta_fast": 32.0, "beta_slow": 1.0,
            "truncate": False, "original_max_position_embeddings": 4096}  # fmt: skip
    parameters, scaling = raw.get("rope_parameters"), raw.get("rope_scaling")
    params = parameters or scaling or yarn
    bias = bool(raw.get("attention_bias", True))
    local_experts, experts = raw.get("num_local_experts"), raw.get("num_experts")
    num_experts = int(local_experts or experts or 128)
    moe = MoeConfig(
        num_experts=num_experts,
        top_k=raw.integer("num_experts_per_tok", 4, low=0),
        intermediate_size=common["intermediate_size"] or 2880,
        norm_topk_prob=True,  # softmax over the top-k router logits
        sparse_layers=(True,) * n,
        router_bias=True,
        expert_bias=True,
        swiglu_limit=float(raw.get("swiglu_limit", 7.0)),
        swiglu_alpha=float(raw.get("swiglu_alpha", 1.702)),
    )
    return ModelConfig(
        **common,
        rope=rope_config(params, float(raw.get("rope_theta", 150000.0))),
        layer_types=layer_types(raw, default),
        qkv_bias=bias,
        o_bias=bias,
        sinks=True,
        sliding_window=raw.integer("sliding_window", 128, low=0),
        moe=moe,
    )


def _olmo2(raw: Reader) -> ModelConfig:
    common = common_fields(raw, eps=1e-5)
    n = common["num_layers"]
    bias = bool(raw.get("attention_bias", False))
    return ModelConfig(
        **common,
        rope=global_rope(raw),
        layer_types=layer_types(raw, ["full_attention"] * n),
        qkv_bias=bias,
        o_bias=bias,
        qk_norm=True,
        qk_norm_per_head=False,  # one norm over all heads' q (and all of k)
    )


def _gemma3(raw: Reader) -> ModelConfig:
    common = common_fields(raw)
    params = raw.get("rope_parameters") or {}
    if "full_attention" in params or "sliding_attention" in params:
        rope = rope_config(params.get("full_attention"), 1_000_000.0)
        local = rope_config(params.get("sliding_attention"), 10_000.0)
        for key in ("rope_scaling", "rope_theta", "rope_local_base_freq"):
            raw.get(key)  # older spellings of the same values; rope_parameters wins
    else:  # older configs: rope_theta + rope_scaling for global layers, a local base frequency
        rope = rope_config(raw.get("rope_scaling"), float(raw.get("rope_theta", 1_000_000.0)))
        local = RopeConfig(theta=float(raw.get("rope_local_base_freq", 10_000.0)))
    if raw.get("use_bidirectional_attention"):
        raise ValueError("bidirectional Gemma 3 attention is not supported")
    # `layer_types` wins when present; the pattern is the older way to say the same thing.
    pattern, derived = raw.get("sliding_window_pattern"), raw.get("_sliding_window_pattern")
    pattern = int(pattern or derived or 6)
    default = [
        "sliding_attention" if (i + 1) % pattern else "full_attention"
        for i in range(common["num_layers"])
    ]
    softcap = raw.get("final_logit_softcapping")
    attn_softcap = raw.get("attn_logit_softcapping")
    common["tie_embeddings"] = bool(raw.get("tie_word_embeddings", True))
    common["max_positions"] = raw.integer("max_position_embeddings", 131072, low=0)
    return ModelConfig(
        **common,
        rope=rope,
        local_rope=local,
        layer_types=layer_types(raw, default),
        qkv_bias=bool(raw.get("attention_bias", False)),
        o_bias=bool(raw.get("attention_bias", False)),
        qk_norm=True,
        sliding_window=raw.integer("sliding_window", 4096, low=0),
        attn_scale=float(raw.get("query_pre_attn_scalar", 256)) ** -0.5,
        embed_scale=math.sqrt(common["hidden_size"]),
        final_logit_softcapping=float(softcap) if softcap else None,
        attn_logit_softcapping=float(attn_softcap) if attn_softcap else None,
    )


def _lfm2(raw: Reader) -> ModelConfig:
    common = common_fields(raw, eps_key="norm_eps", eps=1e-5)
    ff = int(raw.get("block_ff_dim") or raw.require("intermediate_size"))
    if raw.get("block_auto_adjust_ff_dim", True):
        # Same arithmetic as the reference implementation: 2/3 of the width, scaled, rounded up.
        ff = int(2 * ff / 3)
        multiplier = raw.get("block_ffn_dim_multiplier", 1.0)
        if multiplier is not None:
            ff = int(float(multiplier) * ff)
            multiple = raw.integer("block_multiple_of", 256, low=0)
            ff = multiple * ((ff + multiple - 1) // multiple)
    common["intermediate_size"] = ff
    common["tie_embeddings"] = bool(raw.get("tie_word_embeddings", raw.get("tie_embedding", True)))
    for key in ("block_dim", "block_mlp_init_scale", "block_out_init_scale", "block_norm_eps",
                "block_use_swiglu", "block_use_xavier_init", "conv_dim", "conv_dim_out",
                "conv_use_xavier_init", "num_heads", "theta", "use_pos_enc"):  # fmt: skip
        raw.get(key)  # duplicates of read fields or training-only knobs
    n = common["num_layers"]
    full = set(raw.get("full_attn_idxs") or range(n))
    default = ["full_attention" if i in full else "conv" for i in range(n)]
    return ModelConfig(
        **common,
        rope=global_rope(raw, float(raw.get("theta", 1_000_000.0))),
        layer_types=layer_types(raw, default),
        qk_norm=True,
        conv_kernel=raw.integer("conv_L_cache", 3, low=0),
        conv_bias=bool(raw.get("conv_bias", False)),
    )


_PARSERS: dict[str, Callable[[Reader], ModelConfig]] = {
    "llama": _llama,
    "mistral": _llama,
    "qwen2": _llama,
    "qwen3": _llama,
    "qwen3_moe": _qwen3_moe,
    "gemma3_text": _gemma3,
    "gemma3": lambda raw: gemma3_vlm(raw, _gemma3),
    "qwen2_5_vl": lambda raw: qwen2_5_vl(raw, _llama),
    "lfm2": _lfm2,
    "gpt_oss": _gpt_oss,
    "olmo2": _olmo2,
    "deepseek_v2": parse_deepseek,
    "deepseek_v3": parse_deepseek,
    "deepseek_v4": parse_deepseek_v4,
    "glm4_moe": parse_glm4_moe,
    "qwen3_5_moe": parse_qwen3_5_moe,
    "qwen3_5_moe_text": parse_qwen3_5_moe_text,
    "glm5_next": parse_glm5_next,
    "glm5_next_text": parse_glm5_next_text,
}
