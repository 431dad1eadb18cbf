"""GLM-4.5 / GLM-4.5-Air (`glm4_moe`) `config.json` -> `ModelConfig`.

A Llama-style attention (GQA, optional q/k/v bias and per-head q/k norm) whose rotary turns
only the leading `partial_rotary_factor` of each head (half, GLM's default), the first
`first_k_dense_replace` layers dense, the rest DeepSeek-V3's routed MoE: sigmoid scores plus
`e_score_correction_bias` to choose, best `topk_group` of `n_group` groups, renormalised
weights scaled by `routed_scaling_factor`, and `n_shared_experts` always-on experts.
`partial_rotary_factor` is read at the top level (GLM's own configs) or inside
`rope_parameters` (where transformers 5 writes it). The checkpoint's MTP layers
(`num_nextn_predict_layers`, at `model.layers.{N}..`) are counted, not run.
"""

from __future__ import annotations

from resin_model.config import ModelConfig, MoeConfig
from resin_model.hf_reader import Reader, common_fields, rope_config


def parse_glm4_moe(raw: Reader) -> ModelConfig:
    parameters, scaling = raw.get("rope_parameters"), raw.get("rope_scaling")
    params = dict(parameters or scaling or {})
    nested, top = params.pop("partial_rotary_factor", None), raw.get("partial_rotary_factor")
    partial = float(nested if nested is not None else top if top is not None else 0.5)
    if not 0 < partial <= 1:
        raise ValueError(f"partial_rotary_factor must be in (0, 1], got {partial}")
    common = common_fields(raw, eps=1e-5, partial_rotary=True)
    common["max_positions"] = raw.integer("max_position_embeddings", 131072, low=0)
    n = common["num_layers"]
    dense = raw.integer("first_k_dense_replace", 1, low=0)
    inner = raw.integer("moe_intermediate_size", 1408, low=0)
    moe = MoeConfig(
        num_experts=raw.integer("n_routed_experts", 128, low=0),
        top_k=raw.integer("num_experts_per_tok", 8, low=0),
        intermediate_size=inner,
        norm_topk_prob=bool(raw.get("norm_topk_prob", True)),
        sparse_layers=tuple(i >= dense for i in range(n)),
        scoring="sigmoid",
        num_groups=raw.integer("n_group", 1, low=0),
        topk_groups=raw.integer("topk_group", 1, low=0),
        routed_scale=float(raw.get("routed_scaling_factor", 1.0)),
        score_bias=True,
        shared_intermediate_size=inner * raw.integer("n_shared_experts", 1, low=0),
    )
    if moe.num_experts % moe.num_groups or moe.topk_groups > moe.num_groups:
        raise ValueError("n_routed_experts must split into n_group groups, topk_group <= n_group")
    mtp = raw.integer("num_nextn_predict_layers", raw.get("num_mtp_layers", 0), low=0)
    config = ModelConfig(
        **common,
        rope=rope_config(params, float(raw.get("rope_theta", 10000.0))),
        layer_types=("full",) * n,
        qkv_bias=bool(raw.get("attention_bias", False)),
        qk_norm=bool(raw.get("use_qk_norm", False)),
        moe=moe,
        num_mtp_layers=mtp,
        partial_rotary_factor=partial,
    )
    if config.rotary_dim % 2 or config.rotary_dim < 2:
        raise ValueError(f"rotary dim {config.rotary_dim} (head_dim x factor) must be even")
    return config
