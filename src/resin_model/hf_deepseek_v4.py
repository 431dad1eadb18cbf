"""DeepSeek-V4 `config.json` -> `ModelConfig` with its `DeepseekV4Config`.

Two spellings are read, as transformers' `DeepseekV4Config` reads them: the one it saves
(`layer_types`, `compress_rates`, `mlp_layer_types`, `rope_parameters` nested as `main` /
`compress`) and the published checkpoints' (`compress_ratios` per layer as 0 / 4 / 128,
`compress_rate_csa` / `compress_rate_hca`, `num_hash_layers`, `qk_rope_head_dim`, one flat
YaRN dict for the compressed layers). The schedule is the checkpoint's: the published Flash
config lists its own (two sliding-only layers, then CSA / HCA alternating), which differs from
the class default (two HCA layers first) used only when a config names none.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from resin_model.config import AttentionKind, DeepseekV4Config, ModelConfig, MoeConfig
from resin_model.hf_reader import Reader, common_fields, rope_config
from resin_model.quant_config import QuantConfig, parse_quant_config

_KINDS: dict[str, AttentionKind] = {
    "sliding_attention": "sliding",
    "compressed_sparse_attention": "csa",
    "heavily_compressed_attention": "hca",
}


def _schedule(raw: Reader, n: int, csa: int, hca: int) -> tuple[AttentionKind, ...]:
    kinds: list[AttentionKind]
    names = raw.get("layer_types")
    ratios = raw.get("compress_ratios")
    if names is None and ratios is not None:
        by_ratio: dict[int, AttentionKind] = {0: "sliding", csa: "csa", hca: "hca"}
        # transformers maps the published 4 / 128 (whatever the rates say); so do we
        by_ratio.update({4: "csa", 128: "hca"})
        unknown = sorted({int(r) for r in ratios} - set(by_ratio))
        if unknown:
            raise ValueError(f"unsupported compress_ratios {unknown} (known: 0, 4, 128)")
        kinds = [by_ratio[int(r)] for r in ratios]
    elif names is not None:
        unknown = sorted(set(names) - set(_KINDS))
        if unknown:
            raise ValueError(f"unsupported DeepSeek-V4 layer_types {unknown}")
        kinds = [_KINDS[name] for name in names]
    else:  # the class default: two HCA layers, then CSA / HCA alternating
        rest: list[AttentionKind] = ["csa" if i % 2 else "hca" for i in range(max(n - 2, 0))]
        first: list[AttentionKind] = ["hca"] * min(n, 2)
        kinds = first + rest
    if len(kinds) < n:
        raise ValueError(f"the layer schedule lists {len(kinds)} layers, the model has {n}")
    return tuple(kinds[:n])


def _ropes(raw: Reader, rope_dim: int, head_dim: int) -> tuple[Any, Any]:
    """(main rope for sliding-only layers, compress rope for CSA / HCA layers)."""
    params = raw.get("rope_parameters") or raw.get("rope_scaling") or {}
    main_theta = float(raw.get("rope_theta", 10000.0))
    compress_theta = float(raw.get("compress_rope_theta", 160000.0))
    if isinstance(params.get("main"), dict) and isinstance(params.get("compress"), dict):
        main_params, compress_params = dict(params["main"]), dict(params["compress"])
    else:
        main_params = {"rope_type": "default"}
        compress_params = {k: v for k, v in params.items() if k not in ("main", "compress")}
        compress_params["rope_theta"] = compress_theta
    for part in (main_params, compress_params):
        factor = part.pop("partial_rotary_factor", None)
        if factor is not None and int(head_dim * float(factor)) != rope_dim:
            raise ValueError(f"partial_rotary_factor {factor} disagrees with rope dim {rope_dim}")
    kind = compress_params.get("rope_type", compress_params.get("type", "default"))
    if kind == "yarn":  # V4 does not scale cos / sin by YaRN's mscale
        compress_params.setdefault("attention_factor", 1.0)
    return rope_config(main_params, main_theta), rope_config(compress_params, compress_theta)


def parse_deepseek_v4(raw: Reader) -> ModelConfig:
    raw.expect("attention_bias", (False,))
    raw.expect("mlp_bias", (False,))
    raw.expect("num_key_value_heads", (1,))
    raw.expect("scoring_func", ("sqrtsoftplus",))
    raw.expect("hidden_act", ("silu",))
    raw.get("norm_topk_prob")  # V4 always renormalises the chosen weights
    # MTP layers (transformers' default 1, and it saves none: the runner drops them then)
    mtp = raw.integer("num_nextn_predict_layers", 1, low=0)
    common = common_fields(raw, partial_rotary=True)
    n, head_dim = common["num_layers"], common["head_dim"]
    if raw.has("partial_rotary_factor"):
        rope_dim = int(head_dim * float(raw.get("partial_rotary_factor")))
        raw.get("qk_rope_head_dim")  # the same value, spelled by transformers' save
    else:
        rope_dim = int(raw.get("qk_rope_head_dim", 64))
    rates = dict(raw.get("compress_rates") or {})
    csa = int(raw.get("compress_rate_csa", rates.get("compressed_sparse_attention", 4)))
    hca = int(raw.get("compress_rate_hca", rates.get("heavily_compressed_attention", 128)))
    attention = _schedule(raw, n, csa, hca)
    mlp = raw.get("mlp_layer_types")
    if mlp is None:
        hashed = int(raw.get("num_hash_layers", 3))
        mlp = ["hash_moe"] * min(n, hashed) + ["moe"] * max(0, n - hashed)
    unknown = sorted(set(mlp) - {"hash_moe", "moe"})
    if unknown:
        raise ValueError(f"unsupported DeepSeek-V4 mlp_layer_types {unknown}")
    main_rope, compress_rope = _ropes(raw, rope_dim, head_dim)
    moe_inner = int(raw.get("moe_intermediate_size", 2048))
    moe = MoeConfig(
        num_experts=int(raw.require("n_routed_experts")),
        top_k=int(raw.require("num_experts_per_tok")),
        intermediate_size=moe_inner,
        norm_topk_prob=True,
        sparse_layers=(True,) * n,
        scoring="sqrtsoftplus",
        routed_scale=float(raw.get("routed_scaling_factor", 1.5)),
        score_bias=True,
        shared_intermediate_size=moe_inner * int(raw.get("n_shared_experts", 1)),
    )
    v4 = DeepseekV4Config(
        attention=attention,
        hash_layers=tuple(kind == "hash_moe" for kind in mlp[:n]),
        csa_ratio=csa,
        hca_ratio=hca,
        q_lora_rank=int(raw.require("q_lora_rank")),
        rope_dim=rope_dim,
        compress_rope=compress_rope,
        o_groups=int(raw.get("o_groups", 8)),
        o_lora_rank=int(raw.get("o_lora_rank", 1024)),
        index_heads=int(raw.get("index_n_heads", 64)),
        index_head_dim=int(raw.get("index_head_dim", 128)),
        index_topk=int(raw.get("index_topk", 512)),
        hc_mult=int(raw.get("hc_mult", 4)),
        hc_iterations=int(raw.get("hc_sinkhorn_iters", 20)),
        hc_eps=float(raw.get("hc_eps", 1e-6)),
        swiglu_limit=float(raw.get("swiglu_limit", 10.0)),
    )
    if common["num_heads"] * head_dim % v4.o_groups:
        raise ValueError("o_groups must divide num_attention_heads * head_dim")
    common["max_positions"] = int(raw.get("max_position_embeddings", 1048576))
    common["num_kv_heads"] = 1  # one K=V head shared by every query head
    return ModelConfig(
        **common,
        rope=main_rope,
        layer_types=("sliding",) * n,  # every layer reads its raw window
        sliding_window=int(raw.get("sliding_window", 128)),
        moe=moe,
        deepseek_v4=v4,
        num_mtp_layers=mtp,
    )


def deepseek_v4_quant(raw: Reader) -> QuantConfig | None:
    """The published checkpoint's quantization (deepseek-ai/DeepSeek-V4-Flash): FP8 e4m3
    weights in 128 x 128 blocks with UE8M0 (power-of-two, e8m0) scales stored as
    `<module>.scale` (transformers renames `.scale` to `weight_scale_inv` for this model), and,
    with `expert_dtype` "fp4" (in `quantization_config`, or at the top level where the V4
    configs put it: transformers moves it into the quantization config), routed experts in
    packed e2m1 with one e8m0 scale per 32 values under the same name. Modules without a
    `.scale` (routers, norms, the compressors' and indexers' projections, embedding, head)
    are stored unquantized."""
    quantization = raw.get("quantization_config")
    expert_dtype = raw.get("expert_dtype")
    if isinstance(quantization, dict) and expert_dtype is not None:
        quantization = {"expert_dtype": expert_dtype, **quantization}
    elif expert_dtype not in (None, "fp8", "bf16", "bfloat16"):
        raise ValueError(f"expert_dtype {expert_dtype!r} without a quantization_config")
    quant = parse_quant_config(quantization)
    if quant is None or quant.scheme != "fp8_block":
        return quant
    return replace(quant, scale_name="scale")


# Published name piece -> transformers' module name piece, applied in order (transformers'
# `conversion_mapping.py` lists the same renames for `deepseek_v4`).
_RENAMES = (
    (".attn.", ".self_attn."),
    (".ffn.", ".mlp."),
    (".indexer.compressor.", ".compressor.indexer."),
    (".attn_norm.", ".input_layernorm."),
    (".ffn_norm.", ".post_attention_layernorm."),
    (".hc_attn_fn", ".attn_hc.fn"),
    (".hc_attn_base", ".attn_hc.base"),
    (".hc_attn_scale", ".attn_hc.scale"),
    (".hc_ffn_fn", ".ffn_hc.fn"),
    (".hc_ffn_base", ".ffn_hc.base"),
    (".hc_ffn_scale", ".ffn_hc.scale"),
    (".attn_sink", ".sinks"),
    (".indexer.weights_proj.", ".compressor.indexer.scorer.weights_proj."),
    (".indexer.wq_b.", ".compressor.indexer.q_b_proj."),
    (".norm.", ".kv_norm."),
    (".ape", ".position_bias"),
    (".wq_a.", ".q_a_proj."),
    (".self_attn.wq_b.", ".self_attn.q_b_proj."),
    (".wkv.", ".kv_proj."),
    (".wgate.", ".gate_proj."),
    (".wo_a.", ".o_a_proj."),
    (".wo_b.", ".o_b_proj."),
    (".q_norm.", ".q_a_norm."),
    (".gate.bias", ".gate.e_score_correction_bias"),
    (".w1.", ".gate_proj."),
    (".w2.", ".down_proj."),
    (".w3.", ".up_proj."),
)
_TOP = {
    "embed.weight": "model.embed_tokens.weight",
    "embed_tokens.weight": "model.embed_tokens.weight",
    "head.weight": "lm_head.weight",
    "lm_head.weight": "lm_head.weight",
    "norm.weight": "model.norm.weight",
    "hc_head_fn": "model.hc_head.hc_fn",
    "hc_head_base": "model.hc_head.hc_base",
    "hc_head_scale": "model.hc_head.hc_scale",
    "hc_head.hc_fn": "model.hc_head.hc_fn",
    "hc_head.hc_base": "model.hc_head.hc_base",
    "hc_head.hc_scale": "model.hc_head.hc_scale",
}


_MTP_OWN = ("e_proj.", "h_proj.", "enorm.", "hnorm.", "norm.")


def checkpoint_name(name: str) -> str | None:
    """A checkpoint tensor's module name (None: an MTP layer's copy of the shared embedding
    or LM head)."""
    name = name.removeprefix("model.")
    if name.startswith("mtp."):
        _, k, rest = name.split(".", 2)
        if rest.startswith(("emb.", "embed", "head.", "shared_head.head.")):
            return None
        if rest.startswith("hc_head_"):
            return f"mtp.{k}.hc_head.hc_{rest.removeprefix('hc_head_')}"
        if rest.startswith(_MTP_OWN):
            return f"mtp.{k}.{rest}"
        for old, new in _RENAMES:
            rest = ("." + rest).replace(old, new)[1:]
        return f"mtp.{k}.{rest}"
    if name in _TOP:
        return _TOP[name]
    if not name.startswith("layers."):
        return "model." + name
    for old, new in _RENAMES:
        name = name.replace(old, new)
    return "model." + name
