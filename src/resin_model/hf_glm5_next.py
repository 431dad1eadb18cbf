"""GLM-5.3-Flash (`glm5_next`: the multimodal `Glm5NextForConditionalGeneration` folder, text
fields nested under `text_config` or flat; `glm5_next_text`: the text model) `config.json` ->
`ModelConfig`. Only the text path is read; the vision tower's keys are ignored.

Layers: `linear_attention` (KDA) -> "linear", `indexed_attention` (DSA-indexed MLA with NoPE;
`full_attention` is its older name) -> "full". `mlp_layer_types` says which layers are dense
(a clamped SwiGLU of `intermediate_size`) and which sparse (sigmoid-routed experts with the
correction bias, `n_shared_experts` shared ones, `routed_scaling_factor`). The text model has
no positional encoding at all.

Indexer layers marked "shared" (reusing the previous indexed layer's selection) are refused:
in transformers 5.24 a shared layer must directly follow a full one, which GLM-5.3's layout
(indexed layers four apart) never does, and the checkpoint schedule this module knows (every
layer "full", the class default) needs no sharing.
"""

from __future__ import annotations

import re
from typing import Any

from resin_model.config import (
    Glm5NextConfig,
    LayerKind,
    LinearAttentionConfig,
    MlaConfig,
    ModelConfig,
    MoeConfig,
    RopeConfig,
)
from resin_model.hf_reader import Reader, common_fields

# The published names of the parts both runners hold under other names.
_RENAMES = (
    (re.compile(r"\.hc_(attn|ffn)_(fn|base|scale)$"), r".\1_hc.\2"),
    (re.compile(r"\.self_attn\.(dt_bias|A_log)$"), r".self_attn.decay.\1"),
)


def rename_published(name: str) -> str:
    """A published tensor name (`hc_attn_fn`, `self_attn.dt_bias`) as the runners' modules
    name it (`attn_hc.fn`, `self_attn.decay.dt_bias`); other names unchanged."""
    for pattern, replacement in _RENAMES:
        name = pattern.sub(replacement, name)
    return name


_KINDS: dict[str, LayerKind] = {
    "linear_attention": "linear",
    "indexed_attention": "full",
    "full_attention": "full",
    # what transformers 5.17 and older write for the same DSA layer (later ones read it as above)
    "deepseek_sparse_attention": "full",
}
_VISION_KEYS = ("vision_config", "image_token_id", "video_token_id", "image_start_token_id",
                "image_end_token_id", "video_start_token_id", "video_end_token_id")  # fmt: skip


def parse_glm5_next(raw: Reader) -> ModelConfig:
    for key in _VISION_KEYS:
        raw.get(key)
    if not raw.has("text_config"):
        return parse_glm5_next_text(raw)  # flat layout: the text fields at the top level
    part = dict(raw.require("text_config"))
    part.setdefault("model_type", "glm5_next_text")
    text_reader = Reader(part)
    text = parse_glm5_next_text(text_reader)
    text_reader.check_all_read()
    if bool(raw.get("tie_word_embeddings", text.tie_embeddings)) != text.tie_embeddings:
        raise ValueError("tie_word_embeddings differs between the top level and text_config")
    return text


def _indexer_types(raw: Reader, n: int) -> list[str]:
    types = raw.get("indexer_types")
    pattern = raw.get("index_topk_pattern")
    freq = max(int(raw.get("index_topk_freq", 1)), 1)
    offset = int(raw.get("index_skip_topk_offset", 2))
    if types is None and pattern is not None:
        table = {"F": "full", "S": "shared"}
        types = [table[c] for c in pattern] if isinstance(pattern, str) else list(pattern)
    if types is None:
        types = ["full" if max(i - offset + 1, 0) % freq == 0 else "shared" for i in range(n)]
    return [str(t) for t in types]


def parse_glm5_next_text(raw: Reader) -> ModelConfig:
    # transformers writes head_dim = qk_rope_head_dim (0, NoPE): derived, not a size to check
    raw.raw = {key: value for key, value in raw.raw.items() if key != "head_dim"}
    common = common_fields(raw, eps=1e-5)
    common["max_positions"] = int(raw.get("max_position_embeddings", 1048576))
    n, heads = common["num_layers"], common["num_heads"]
    if common["num_kv_heads"] != heads:
        raise ValueError("glm5_next needs num_key_value_heads == num_attention_heads")
    default = ["linear_attention" if i % 4 != 3 else "indexed_attention" for i in range(n)]
    names = raw.get("layer_types") or default
    if set(names) - set(_KINDS):
        raise ValueError(f"unsupported glm5_next layer types {sorted(set(names) - set(_KINDS))}")
    types = tuple(_KINDS[name] for name in names)
    indexer = _indexer_types(raw, n)
    if any(kind == "full" and indexer[i] != "full" for i, kind in enumerate(types)):
        raise ValueError("glm5_next indexed layers that share another layer's selection "
                         "(indexer_types 'shared') are not supported")  # fmt: skip
    if int(raw.get("qk_rope_head_dim", 0)):
        raise ValueError("glm5_next attention is NoPE: qk_rope_head_dim must be 0")
    raw.get("head_dim")  # transformers overwrites it with qk_rope_head_dim (0)
    raw.get("qk_head_dim")  # derived: qk_nope_head_dim + qk_rope_head_dim
    raw.expect("attention_bias", (False,))
    raw.expect("index_kpool_always_select_tail", (True,))
    raw.get("num_nextn_predict_layers")  # the MTP layer is not loaded
    linear: dict[str, Any] = dict(raw.get("linear_attn_config") or {})
    raw.get("linear_lower_bound")  # an explicit null selects the softplus form
    lower = raw.raw.get("linear_lower_bound", -5.0)
    if linear:
        lower = linear.get("gate_lower_bound", lower)
        if lower is None and linear.get("safe_gate", True):
            lower = -5.0
    kda_heads = int(linear.get("num_heads", raw.get("linear_num_heads", 64)))
    kda_dim = int(linear.get("head_dim", raw.get("linear_head_dim", 128)))
    kernel = int(linear.get("short_conv_kernel_size", raw.get("linear_conv_kernel_dim", 4)))
    mlp_types = raw.get("mlp_layer_types") or ["dense"] * min(3, n) + ["sparse"] * (n - 3)
    if set(mlp_types) - {"dense", "sparse"} or len(mlp_types) != n:
        raise ValueError(f"unsupported mlp_layer_types {mlp_types}")
    experts = int(raw.get("n_routed_experts") or raw.get("num_local_experts") or 288)
    moe_width = int(raw.get("moe_intermediate_size", 2048))
    moe = MoeConfig(
        num_experts=experts,
        top_k=int(raw.get("num_experts_per_tok", 8)),
        intermediate_size=moe_width,
        norm_topk_prob=bool(raw.get("norm_topk_prob", True)),
        sparse_layers=tuple(t == "sparse" for t in mlp_types),
        scoring="sigmoid",
        num_groups=int(raw.get("n_group", 1)),
        topk_groups=int(raw.get("topk_group", 1)),
        routed_scale=float(raw.get("routed_scaling_factor", 2.5)),
        score_bias=True,
        shared_intermediate_size=moe_width * int(raw.get("n_shared_experts", 1)),
    )
    nope = int(raw.get("qk_nope_head_dim", 256))
    index_topk, kpool = int(raw.get("index_topk", 2048)), int(raw.get("index_kpool", 16))
    if kpool < 1 or index_topk % kpool:
        raise ValueError(f"index_topk {index_topk} must be a multiple of index_kpool {kpool}")
    q_lora = raw.get("q_lora_rank", 1536)
    if q_lora is None:
        raise ValueError("glm5_next needs q_lora_rank (its indexer reads the q LoRA output)")
    return ModelConfig(
        **{**common, "head_dim": nope, "intermediate_size": common["intermediate_size"] or 12288},
        rope=RopeConfig(theta=10000.0),  # unused: no positional encoding
        layer_types=types,
        attn_scale=nope**-0.5,
        moe=moe,
        mla=MlaConfig(
            q_lora_rank=int(q_lora),
            kv_lora_rank=int(raw.get("kv_lora_rank", 512)),
            nope_dim=nope,
            rope_dim=0,
            v_head_dim=int(raw.get("v_head_dim", 256)),
        ),
        linear_attention=LinearAttentionConfig(kda_heads, kda_heads, kda_dim, kda_dim, kernel),
        glm5_next=Glm5NextConfig(
            index_heads=int(raw.get("index_n_heads", 32)),
            index_head_dim=int(raw.get("index_head_dim", 128)),
            index_topk=index_topk,
            index_kpool=kpool,
            gate_lower_bound=None if lower is None else float(lower),
            swiglu_limit=float(raw.get("swiglu_limit", 10.0)),
            hc_mult=int(raw.get("hc_mult", 4)),
            hc_iterations=int(raw.get("hc_sinkhorn_iters", 20)),
            hc_eps=float(raw.get("hc_eps", 1e-6)),
        ),
    )
