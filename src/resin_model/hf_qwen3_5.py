"""Qwen3.5 (`qwen3_5_moe`, the multimodal folder, and `qwen3_5_moe_text`, the text-only
`Qwen3_5MoeForCausalLM` folder) `config.json` -> `ModelConfig`.

Three Gated DeltaNet layers per gated full-attention layer (`layer_types` from the checkpoint,
else every `full_attention_interval`-th layer is full attention), a quarter of each head
rotated (`partial_rotary_factor`, the leading dims), M-RoPE sections whose three position axes
coincide for text (so it is plain rotary on those dims), and a softmax top-k MoE with a
sigmoid-gated shared expert on every layer. The multimodal folder's vision tower is not read:
only its text path is served.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from resin_model.config import LinearAttentionConfig, ModelConfig, MoeConfig
from resin_model.hf_reader import Reader, common_fields, layer_types, rope_config

_VISION_KEYS = ("vision_config", "image_token_id", "video_token_id", "vision_start_token_id",
                "vision_end_token_id")  # fmt: skip


def parse_qwen3_5_moe(raw: Reader) -> ModelConfig:
    """The multimodal layout nests the text model under `text_config`; its vision keys are
    read and ignored (images are not supported by this runner)."""
    if not raw.has("text_config"):
        return parse_qwen3_5_moe_text(raw)
    part = dict(raw.require("text_config"))
    part.setdefault("model_type", "qwen3_5_moe_text")
    text_reader = Reader(part)
    text = parse_qwen3_5_moe_text(text_reader)
    text_reader.check_all_read()
    for key in _VISION_KEYS:
        raw.get(key)
    if bool(raw.get("tie_word_embeddings", text.tie_embeddings)) != text.tie_embeddings:
        raise ValueError("tie_word_embeddings differs between the top level and text_config")
    return replace(text, model_type="qwen3_5_moe")


def parse_qwen3_5_moe_text(raw: Reader) -> ModelConfig:
    common = common_fields(raw, partial_rotary=True)
    common["max_positions"] = int(raw.get("max_position_embeddings", 32768))
    n = common["num_layers"]
    interval = int(raw.get("full_attention_interval", 4))
    default = ["full_attention" if (i + 1) % interval == 0 else "linear_attention"
               for i in range(n)]  # fmt: skip
    types = layer_types(raw, default)
    if set(types) - {"full", "linear"}:
        raise ValueError(f"qwen3_5_moe layers are full_attention or linear_attention: {types}")
    params: dict[str, Any] = dict(raw.get("rope_parameters") or raw.get("rope_scaling") or {})
    partial = float(params.pop("partial_rotary_factor", raw.get("partial_rotary_factor", 0.25)))
    section = tuple(int(x) for x in params.pop("mrope_section", ()))
    params.pop("mrope_interleaved", None)  # text positions are equal on all three axes
    rotary_dim = int(common["head_dim"] * partial)
    if section and 2 * sum(section) != rotary_dim:
        raise ValueError(f"mrope_section {section} must split the {rotary_dim} rotary dims / 2")
    raw.expect("attn_output_gate", (True,))
    raw.expect("norm_topk_prob", (True,))
    raw.expect("decoder_sparse_step", (1,))
    raw.expect("mamba_ssm_dtype", ("float32",))  # the recurrent state is always float32 here
    if raw.get("mlp_only_layers"):
        raise ValueError("qwen3_5_moe with dense mlp_only_layers is not supported")
    for key in ("mtp_num_hidden_layers", "mtp_use_dedicated_embeddings"):
        raw.get(key)  # the MTP head is not loaded (its weights are skipped)
    linear = LinearAttentionConfig(
        num_k_heads=int(raw.get("linear_num_key_heads", 16)),
        num_v_heads=int(raw.get("linear_num_value_heads", 32)),
        k_head_dim=int(raw.get("linear_key_head_dim", 128)),
        v_head_dim=int(raw.get("linear_value_head_dim", 128)),
        conv_kernel=int(raw.get("linear_conv_kernel_dim", 4)),
    )
    moe = MoeConfig(
        num_experts=int(raw.get("num_experts", 256)),
        top_k=int(raw.get("num_experts_per_tok", 8)),
        intermediate_size=int(raw.get("moe_intermediate_size", 512)),
        norm_topk_prob=True,  # renormalised over the top k, always (transformers 5.24)
        sparse_layers=(True,) * n,
        shared_intermediate_size=int(raw.get("shared_expert_intermediate_size", 512)),
    )
    bias = bool(raw.get("attention_bias", False))
    return ModelConfig(
        **common,
        rope=rope_config(params, 10000.0),
        layer_types=types,
        qkv_bias=bias,
        o_bias=bias,
        qk_norm=True,
        partial_rotary_factor=partial,
        moe=moe,
        linear_attention=linear,
    )
