"""DeepSeek V2 / V3 `config.json` -> `ModelConfig` (MLA, grouped routing, shared experts, MTP).

Both the Hugging Face exports (`rope_parameters`, `num_nextn_predict_layers`, `head_dim` =
rope dim) and DeepSeek's own configs (`rope_scaling` + `rope_theta`, `scoring_func`,
`topk_method`, `moe_layer_freq`, `ep_size`) are read. Routing follows the model type, as
`transformers` does: V3 scores with a sigmoid plus `e_score_correction_bias` and keeps the best
`topk_group` of `n_group` groups (a group scores the sum of its two best experts); V2 scores
with a softmax, `greedy` over all experts or `group_limited_greedy` (a group scores its best
expert). The softmax scale gains YaRN's `mscale_all_dim` correction squared, the way
DeepSeek's attention applies it.
"""

from __future__ import annotations

from dataclasses import replace

from resin_model.config import MlaConfig, ModelConfig, MoeConfig
from resin_model.hf_reader import Reader, common_fields, global_rope, yarn_mscale

# DeepSeek's own configs carry these; none changes inference math.
_HARMLESS = ("aux_loss_alpha", "seq_aux", "ep_size", "qk_head_dim")


def parse_deepseek(raw: Reader) -> ModelConfig:
    v3 = raw.get("model_type") == "deepseek_v3"
    raw.expect("attention_bias", (False,))
    raw.expect("mlp_bias", (False,))
    raw.expect("moe_layer_freq", (1,))
    raw.expect("scoring_func", ("sigmoid",) if v3 else ("softmax",))
    raw.expect("topk_method", ("noaux_tc",) if v3 else ("greedy", "group_limited_greedy"))
    for key in _HARMLESS:
        raw.get(key)
    common = common_fields(raw)
    n, heads = common["num_layers"], common["num_heads"]
    mla = MlaConfig(
        q_lora_rank=int(raw.get("q_lora_rank")) if raw.has("q_lora_rank") else None,
        kv_lora_rank=raw.integer("kv_lora_rank", low=0),
        nope_dim=raw.integer("qk_nope_head_dim", low=0),
        rope_dim=raw.integer("qk_rope_head_dim", low=0),
        v_head_dim=raw.integer("v_head_dim", low=0),
        # V2 rotates interleaved pairs (complex form); V3 says so with rope_interleave.
        rope_interleave=bool(raw.get("rope_interleave", True)) if v3 else True,
    )
    rope = global_rope(raw)
    qk_dim = mla.nope_dim + mla.rope_dim
    scale = qk_dim**-0.5
    params = raw.raw.get("rope_parameters") or raw.raw.get("rope_scaling") or {}
    all_dim = params.get("mscale_all_dim")
    if rope.kind != "default" and all_dim:
        scale *= yarn_mscale(rope.factor, float(all_dim)) ** 2
    greedy = not v3 and raw.get("topk_method", "greedy") == "greedy"
    if greedy:
        raw.get("n_group"), raw.get("topk_group")  # unused by greedy routing
    norm_topk = bool(raw.get("norm_topk_prob", v3))
    if norm_topk and not v3:
        raise ValueError(
            "deepseek_v2 with norm_topk_prob=true is not supported (transformers ignores the "
            "flag, DeepSeek's code applies it)"
        )
    dense = raw.integer("first_k_dense_replace", 3 if v3 else 0, low=0)
    moe_inner = raw.integer("moe_intermediate_size", low=0)
    moe = MoeConfig(
        num_experts=raw.integer("n_routed_experts", low=0),
        top_k=raw.integer("num_experts_per_tok", low=0),
        intermediate_size=moe_inner,
        norm_topk_prob=norm_topk,
        sparse_layers=tuple(i >= dense for i in range(n)),
        scoring="sigmoid" if v3 else "softmax",
        num_groups=1 if greedy else raw.integer("n_group", low=0),
        topk_groups=1 if greedy else raw.integer("topk_group", low=0),
        routed_scale=float(raw.get("routed_scaling_factor", 2.5 if v3 else 1.0)),
        score_bias=v3,
        shared_intermediate_size=moe_inner * raw.integer("n_shared_experts", 1 if v3 else 2, low=0),
    )
    if moe.num_experts % moe.num_groups or moe.topk_groups > moe.num_groups:
        raise ValueError("n_routed_experts must split into n_group groups, topk_group <= n_group")
    mtp = raw.integer("num_nextn_predict_layers", 0, low=0)
    raw.get("num_mtp_layers")  # the transformers spelling of the same count
    config = ModelConfig(**common, rope=rope, layer_types=("full",) * n, moe=moe, mla=mla)
    return replace(
        config, num_kv_heads=heads, head_dim=qk_dim, attn_scale=scale, num_mtp_layers=mtp
    )
