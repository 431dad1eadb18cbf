"""Model shapes the benchmark and the tests build with random weights, as Hugging Face
`config.json` dicts (so a preset goes through the same `parse_config` as a checkpoint), and the
byte / parameter counts the benchmark reads its ceilings from."""

from __future__ import annotations

from typing import Any

from resin_model.config import ModelConfig
from resin_model.hf_config import parse_config

_LLAMA_8B: dict[str, Any] = {
    "model_type": "llama", "vocab_size": 128256, "hidden_size": 4096,
    "intermediate_size": 14336, "num_hidden_layers": 32, "num_attention_heads": 32,
    "num_key_value_heads": 8, "head_dim": 128, "rms_norm_eps": 1e-5,
    "rope_parameters": {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0,
                        "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                        "original_max_position_embeddings": 8192},
    "max_position_embeddings": 131072,
}  # fmt: skip

_GPT_OSS_20B: dict[str, Any] = {
    "model_type": "gpt_oss", "vocab_size": 201088, "hidden_size": 2880,
    "intermediate_size": 2880, "num_hidden_layers": 24, "num_attention_heads": 64,
    "num_key_value_heads": 8, "head_dim": 64, "num_local_experts": 32,
    "num_experts_per_tok": 4, "sliding_window": 128, "max_position_embeddings": 131072,
    "rope_parameters": {"rope_type": "yarn", "rope_theta": 150000.0, "factor": 32.0,
                        "beta_fast": 32.0, "beta_slow": 1.0, "truncate": False,
                        "original_max_position_embeddings": 4096},
}  # fmt: skip

PRESETS: dict[str, dict[str, Any]] = {
    "llama-8b": _LLAMA_8B,
    "llama-1b": {**_LLAMA_8B, "hidden_size": 2048, "intermediate_size": 8192,
                 "num_hidden_layers": 16, "head_dim": 64, "tie_word_embeddings": True},
    "qwen3-8b": {**_LLAMA_8B, "model_type": "qwen3", "vocab_size": 151936,
                 "intermediate_size": 12288, "num_hidden_layers": 36, "rms_norm_eps": 1e-6,
                 "rope_parameters": {"rope_type": "default", "rope_theta": 1e6},
                 "max_position_embeddings": 40960},
    "qwen3-30b-a3b": {
        "model_type": "qwen3_moe", "vocab_size": 151936, "hidden_size": 2048,
        "intermediate_size": 6144, "num_hidden_layers": 48, "num_attention_heads": 32,
        "num_key_value_heads": 4, "head_dim": 128, "rms_norm_eps": 1e-6,
        "rope_parameters": {"rope_type": "default", "rope_theta": 1e6},
        "max_position_embeddings": 40960, "num_experts": 128, "num_experts_per_tok": 8,
        "moe_intermediate_size": 768, "norm_topk_prob": True,
    },
    "gpt-oss-20b": _GPT_OSS_20B,
    # the published config: gpt-oss-20b's layer, 36 layers of 128 experts
    "gpt-oss-120b": {**_GPT_OSS_20B, "num_hidden_layers": 36, "num_local_experts": 128},
    "gemma3-12b": {
        "model_type": "gemma3_text", "vocab_size": 262208, "hidden_size": 3840,
        "intermediate_size": 15360, "num_hidden_layers": 48, "num_attention_heads": 16,
        "num_key_value_heads": 8, "head_dim": 256, "query_pre_attn_scalar": 256,
        "sliding_window": 1024, "sliding_window_pattern": 6,
        "hidden_activation": "gelu_pytorch_tanh", "rope_theta": 1e6,
        "rope_local_base_freq": 1e4, "rope_scaling": {"rope_type": "linear", "factor": 8.0},
        "max_position_embeddings": 131072,
    },
    "olmo2-7b": {
        "model_type": "olmo2", "vocab_size": 100352, "hidden_size": 4096,
        "intermediate_size": 11008, "num_hidden_layers": 32, "num_attention_heads": 32,
        "num_key_value_heads": 32, "rms_norm_eps": 1e-6, "rope_theta": 500000.0,
        "max_position_embeddings": 4096,
    },
    "deepseek-v2-lite": {
        "model_type": "deepseek_v2", "vocab_size": 102400, "hidden_size": 2048,
        "intermediate_size": 10944, "num_hidden_layers": 27, "num_attention_heads": 16,
        "num_key_value_heads": 16, "rms_norm_eps": 1e-6, "max_position_embeddings": 163840,
        "kv_lora_rank": 512, "q_lora_rank": None, "qk_rope_head_dim": 64,
        "qk_nope_head_dim": 128, "v_head_dim": 128, "n_routed_experts": 64,
        "num_experts_per_tok": 6, "n_shared_experts": 2, "moe_intermediate_size": 1408,
        "first_k_dense_replace": 1, "topk_method": "greedy", "routed_scaling_factor": 1.0,
        "rope_theta": 10000.0,
        "rope_scaling": {"type": "yarn", "factor": 40, "mscale": 0.707, "mscale_all_dim": 0.707,
                         "original_max_position_embeddings": 4096, "beta_fast": 32,
                         "beta_slow": 1},
    },
    "deepseek-v3-4l": {  # DeepSeek-V3's shapes with 4 of its 61 layers (3 dense, 1 MoE) and
        # its MTP layer: what one H200 holds in bf16 (`resin bench speculative --speculative mtp`)
        "model_type": "deepseek_v3", "vocab_size": 129280, "hidden_size": 7168,
        "intermediate_size": 18432, "num_hidden_layers": 4, "num_attention_heads": 128,
        "num_key_value_heads": 128, "rms_norm_eps": 1e-6, "max_position_embeddings": 163840,
        "kv_lora_rank": 512, "q_lora_rank": 1536, "qk_rope_head_dim": 64,
        "qk_nope_head_dim": 128, "v_head_dim": 128, "n_routed_experts": 256,
        "num_experts_per_tok": 8, "n_group": 8, "topk_group": 4, "n_shared_experts": 1,
        "moe_intermediate_size": 2048, "first_k_dense_replace": 3, "topk_method": "noaux_tc",
        "scoring_func": "sigmoid", "norm_topk_prob": True, "routed_scaling_factor": 2.5,
        "rope_theta": 10000.0, "num_nextn_predict_layers": 1,
        "rope_scaling": {"type": "yarn", "factor": 40, "mscale": 1.0, "mscale_all_dim": 1.0,
                         "original_max_position_embeddings": 4096, "beta_fast": 32,
                         "beta_slow": 1},
    },
    "glm-4.5-air": {
        "model_type": "glm4_moe", "vocab_size": 151552, "hidden_size": 4096,
        "intermediate_size": 10944, "num_hidden_layers": 46, "num_attention_heads": 96,
        "num_key_value_heads": 8, "head_dim": 128, "partial_rotary_factor": 0.5,
        "rms_norm_eps": 1e-5, "rope_theta": 1e6, "max_position_embeddings": 131072,
        "attention_bias": True, "use_qk_norm": False, "n_routed_experts": 128,
        "num_experts_per_tok": 8, "n_shared_experts": 1, "moe_intermediate_size": 1408,
        "first_k_dense_replace": 1, "n_group": 1, "topk_group": 1, "norm_topk_prob": True,
        "routed_scaling_factor": 1.0, "num_nextn_predict_layers": 1,
    },
    "qwen3.5-35b-a3b": {  # the text path of Qwen/Qwen3.5-35B-A3B (its config's text_config)
        "model_type": "qwen3_5_moe_text", "vocab_size": 248320, "hidden_size": 2048,
        "num_hidden_layers": 40, "num_attention_heads": 16, "num_key_value_heads": 2,
        "head_dim": 256, "rms_norm_eps": 1e-6, "max_position_embeddings": 262144,
        "full_attention_interval": 4, "linear_num_key_heads": 16,
        "linear_num_value_heads": 32, "linear_key_head_dim": 128, "linear_value_head_dim": 128,
        "linear_conv_kernel_dim": 4, "num_experts": 256, "num_experts_per_tok": 8,
        "moe_intermediate_size": 512, "shared_expert_intermediate_size": 512,
        "rope_parameters": {"rope_type": "default", "rope_theta": 1e7,
                            "partial_rotary_factor": 0.25, "mrope_section": [11, 11, 10],
                            "mrope_interleaved": True},
    },
    "glm-5.3-flash": {  # the text path of zai-org/GLM-5.3-Flash (class defaults: 45 layers)
        "model_type": "glm5_next_text", "vocab_size": 154880, "hidden_size": 4096,
        "intermediate_size": 12288, "moe_intermediate_size": 2048, "num_hidden_layers": 45,
        "num_attention_heads": 64, "num_key_value_heads": 64, "n_routed_experts": 288,
        "num_experts_per_tok": 8, "n_shared_experts": 1, "routed_scaling_factor": 2.5,
        "kv_lora_rank": 512, "q_lora_rank": 1536, "qk_rope_head_dim": 0,
        "qk_nope_head_dim": 256, "v_head_dim": 256, "index_topk": 2048, "index_head_dim": 128,
        "index_n_heads": 32, "index_kpool": 16, "linear_head_dim": 128, "linear_num_heads": 64,
        "linear_conv_kernel_dim": 4, "linear_lower_bound": -5.0, "hc_mult": 4,
        "hc_sinkhorn_iters": 20, "hc_eps": 1e-6, "swiglu_limit": 10.0, "rms_norm_eps": 1e-5,
        "max_position_embeddings": 1048576,
    },
}  # fmt: skip

# deepseek-ai/DeepSeek-V4-Flash: transformers 5.24's class defaults (its config of the model)
# with the published per-layer schedule (`compress_ratios`: two sliding-only layers, then CSA
# on even and HCA on odd layers: 21 CSA, 20 HCA) and YaRN factor 16 on the compressed layers
# (original context 65,536 = 1,048,576 / 16).
PRESETS["deepseek-v4-flash"] = {
    "model_type": "deepseek_v4", "vocab_size": 129280, "hidden_size": 4096,
    "num_hidden_layers": 43, "num_attention_heads": 64, "num_key_value_heads": 1,
    "head_dim": 512, "q_lora_rank": 1024, "qk_rope_head_dim": 64, "n_routed_experts": 256,
    "num_experts_per_tok": 6, "n_shared_experts": 1, "moe_intermediate_size": 2048,
    "scoring_func": "sqrtsoftplus", "routed_scaling_factor": 1.5, "num_hash_layers": 3,
    "compress_ratios": [0, 0] + [4 if i % 2 == 0 else 128 for i in range(41)],
    "compress_rope_theta": 160000.0, "rope_theta": 10000.0,
    "rope_scaling": {"type": "yarn", "factor": 16.0, "original_max_position_embeddings": 65536,
                     "beta_fast": 32, "beta_slow": 1},
    "sliding_window": 128, "o_groups": 8, "o_lora_rank": 1024, "index_n_heads": 64,
    "index_head_dim": 128, "index_topk": 512, "hc_mult": 4, "hc_sinkhorn_iters": 20,
    "hc_eps": 1e-6, "swiglu_limit": 10.0, "rms_norm_eps": 1e-6,
    "max_position_embeddings": 1048576, "num_nextn_predict_layers": 1, "bos_token_id": 0,
    "eos_token_id": 1,
}  # fmt: skip
# Its first 8 layers (sliding x2, then CSA / HCA x3) and the MTP layer: 53.7 B parameters,
# 107.5 GB in bf16 or 53.7 GB in FP8 (the LM head and embedding in bf16: 54.8 GB), one H200.
PRESETS["deepseek-v4-flash-8l"] = {
    **PRESETS["deepseek-v4-flash"], "num_hidden_layers": 8,
    "compress_ratios": PRESETS["deepseek-v4-flash"]["compress_ratios"][:8],
}  # fmt: skip

# Tiny shapes of every architecture (CPU interpreter tests, GPU correctness checks).
_TINY: dict[str, Any] = {
    "vocab_size": 256, "hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 2,
    "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
    "max_position_embeddings": 512,
}  # fmt: skip

TINY: dict[str, dict[str, Any]] = {
    "llama": {**_TINY, "model_type": "llama"},
    "mistral": {**_TINY, "model_type": "mistral", "sliding_window": 9},
    "qwen2": {**_TINY, "model_type": "qwen2"},
    "qwen3": {**_TINY, "model_type": "qwen3", "tie_word_embeddings": True},
    "qwen3_moe": {**_TINY, "model_type": "qwen3_moe", "num_experts": 6,
                  "num_experts_per_tok": 2, "moe_intermediate_size": 24,
                  "norm_topk_prob": True, "mlp_only_layers": [1]},
    "gemma3": {**_TINY, "model_type": "gemma3_text", "num_hidden_layers": 3,
               "sliding_window": 6, "query_pre_attn_scalar": 16,
               "hidden_activation": "gelu_pytorch_tanh",
               "layer_types": ["sliding_attention", "full_attention", "sliding_attention"]},
    "gpt_oss": {**_TINY, "model_type": "gpt_oss", "intermediate_size": 32,
                "num_local_experts": 6, "num_experts_per_tok": 2, "sliding_window": 5,
                "rope_parameters": {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0,
                                    "beta_fast": 32.0, "beta_slow": 1.0, "truncate": False,
                                    "original_max_position_embeddings": 16}},
    "olmo2": {**_TINY, "model_type": "olmo2"},
    "glm4_moe": {**_TINY, "model_type": "glm4_moe", "attention_bias": True,
                 "use_qk_norm": True, "partial_rotary_factor": 0.5, "n_routed_experts": 8,
                 "num_experts_per_tok": 2, "moe_intermediate_size": 24, "n_shared_experts": 1,
                 "first_k_dense_replace": 1, "n_group": 2, "topk_group": 1,
                 "routed_scaling_factor": 2.5, "num_nextn_predict_layers": 1},
}  # fmt: skip
PRESETS.update({f"tiny-{name}": raw for name, raw in TINY.items()})
PRESETS["deepseek-v2-lite-mtp"] = {  # V2-Lite at full depth plus one MTP layer of its shapes
    **PRESETS["deepseek-v2-lite"],
    "num_nextn_predict_layers": 1,
}
PRESETS["tiny-deepseek"] = {  # V2-Lite's structure, tiny (CPU smoke runs of `resin bench runner`)
    **PRESETS["deepseek-v2-lite"], "vocab_size": 256, "hidden_size": 64, "intermediate_size": 96,
    "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 4,
    "kv_lora_rank": 64, "qk_rope_head_dim": 16, "qk_nope_head_dim": 16, "v_head_dim": 16,
    "n_routed_experts": 8, "num_experts_per_tok": 2, "moe_intermediate_size": 24,
    "max_position_embeddings": 512,
}  # fmt: skip
PRESETS["tiny-deepseek-mtp"] = {**PRESETS["tiny-deepseek"], "num_nextn_predict_layers": 1}
PRESETS["tiny"] = TINY["llama"]
# Tiny hybrids the reference runner alone serves (TINY lists what both families run).
PRESETS["tiny-qwen3_5_moe"] = {
    **_TINY, "model_type": "qwen3_5_moe_text", "num_hidden_layers": 4,
    "linear_num_key_heads": 2, "linear_num_value_heads": 4, "linear_key_head_dim": 16,
    "linear_value_head_dim": 16, "num_experts": 6, "num_experts_per_tok": 2,
    "moe_intermediate_size": 24, "shared_expert_intermediate_size": 32,
}  # fmt: skip
PRESETS["tiny-glm5_next"] = {
    **_TINY, "model_type": "glm5_next_text", "num_hidden_layers": 4, "num_key_value_heads": 4,
    "moe_intermediate_size": 24, "n_routed_experts": 6, "num_experts_per_tok": 2,
    "kv_lora_rank": 32, "q_lora_rank": 24, "qk_nope_head_dim": 16, "v_head_dim": 16,
    "index_head_dim": 16, "index_n_heads": 2, "linear_head_dim": 16, "linear_num_heads": 2,
    "mlp_layer_types": ["dense", "sparse", "sparse", "sparse"],
}  # fmt: skip
PRESETS["tiny-deepseek_v4"] = {  # every V4 mechanism, HCA ratio 16 (CPU smoke runs)
    **PRESETS["deepseek-v4-flash"], "vocab_size": 256, "hidden_size": 64,
    "num_hidden_layers": 4, "num_attention_heads": 4, "head_dim": 32, "q_lora_rank": 32,
    "qk_rope_head_dim": 8, "n_routed_experts": 4, "num_experts_per_tok": 2,
    "moe_intermediate_size": 32, "num_hash_layers": 1, "compress_ratios": [0, 0, 4, 128],
    "compress_rate_hca": 16, "sliding_window": 16, "o_groups": 2, "o_lora_rank": 16,
    "index_n_heads": 8, "index_head_dim": 16, "index_topk": 4, "hc_mult": 2,
    "max_position_embeddings": 1024,
    "rope_scaling": {"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 256,
                     "beta_fast": 32, "beta_slow": 1},
}  # fmt: skip
PRESETS["qwen3.5-35b-a3b-8l"] = {  # its first 8 layers (6 GDN, 2 full): 15.5 GB in bf16, a
    **PRESETS["qwen3.5-35b-a3b"], "num_hidden_layers": 8,  # random folder quick to write
}  # fmt: skip
PRESETS["glm-5.3-flash-8l"] = {  # two KDA x3 + indexed-MLA groups: 78 GB in bf16, one H200
    **PRESETS["glm-5.3-flash"], "num_hidden_layers": 8,
}  # fmt: skip
PRESETS["glm-5.3-flash-6l"] = {  # KDA x3, indexed MLA, KDA x2 (the last three MoE): 48.7 GB
    **PRESETS["glm-5.3-flash"], "num_hidden_layers": 6,  # in bf16, for an 80 GB card
}  # fmt: skip


def preset(name: str) -> ModelConfig:
    return parse_config(preset_hf(name))


def preset_hf(name: str) -> dict[str, Any]:
    try:
        return dict(PRESETS[name])
    except KeyError:
        raise ValueError(f"unknown model config {name!r}; known: {sorted(PRESETS)}") from None


def kv_bytes_read(config: ModelConfig, context: int, dtype_bytes: int = 2) -> int:
    """KV bytes attention reads for one row at `context` tokens (sliding layers: the window;
    linear-attention layers: their state, float32 recurrent matrices and conv inputs)."""
    window = int(config.sliding_window or context)
    if config.deepseek_v4 is not None:
        return _v4_kv_bytes_read(config, context, dtype_bytes)
    per_layer = 2 * config.kv_size * dtype_bytes
    if config.mla is not None:  # one latent per token per layer
        per_layer = config.mla.latent_dim * dtype_bytes
    lin = config.linear_attention
    state = 0
    if lin is not None:
        recurrent = 4 * lin.num_v_heads * lin.k_head_dim * lin.v_head_dim
        state = recurrent + lin.conv_channels * (lin.conv_kernel - 1) * dtype_bytes
    return sum(
        state if kind == "linear"
        else per_layer * (min(context, window) if kind == "sliding" else context)
        for kind in config.layer_types
    )  # fmt: skip


def _v4_kv_bytes_read(config: ModelConfig, context: int, dtype_bytes: int) -> int:
    """DeepSeek-V4: every layer reads its window of K=V vectors; CSA layers all indexer keys
    and the `index_topk` entries chosen, HCA layers every entry."""
    v4, d = config.deepseek_v4, config.head_dim
    assert v4 is not None and config.sliding_window is not None
    window = min(context, config.sliding_window) * d
    total = 0
    for kind in v4.attention:
        total += window
        if kind == "csa":
            entries = context // v4.csa_ratio
            total += entries * v4.index_head_dim + min(entries, v4.index_topk) * d
        elif kind == "hca":
            total += context // v4.hca_ratio * d
    return total * dtype_bytes


def _v4_layer_params(config: ModelConfig, kind: str) -> int:
    """A DeepSeek-V4 layer's attention (q / K=V / grouped output projections, sinks; the
    compressor, twice as wide in CSA layers, plus CSA's indexer) and its two mHC maps; norms
    left out."""
    v4, h, heads, d = config.deepseek_v4, config.hidden_size, config.num_heads, config.head_dim
    assert v4 is not None
    rank = v4.q_lora_rank
    params = h * rank + rank * heads * d + h * d + heads * d * v4.o_lora_rank
    params += v4.o_groups * v4.o_lora_rank * h + heads
    if kind != "sliding":
        width, ratio = (2 * d, v4.csa_ratio) if kind == "csa" else (d, v4.hca_ratio)
        params += 2 * h * width + ratio * width
    if kind == "csa":
        width, dim = 2 * v4.index_head_dim, v4.index_head_dim
        params += 2 * h * width + v4.csa_ratio * width
        params += rank * v4.index_heads * dim + h * v4.index_heads
    n = v4.hc_mult
    return params + 2 * ((2 + n) * n * (n * h + 1) + 3)


def _expert_params(config: ModelConfig) -> int:
    assert config.moe is not None
    return 3 * config.hidden_size * config.moe.intermediate_size


def _attention_params(config: ModelConfig) -> int:
    h, mla = config.hidden_size, config.mla
    if mla is None:
        return h * (config.q_size + 2 * config.kv_size) + config.q_size * h
    heads, qk = config.num_heads, mla.nope_dim + mla.rope_dim
    rank = mla.q_lora_rank
    q = h * heads * qk if rank is None else h * rank + rank * heads * qk
    kv = h * mla.latent_dim + mla.kv_lora_rank * heads * (mla.nope_dim + mla.v_head_dim)
    return q + kv + heads * mla.v_head_dim * h


def _linear_attention_params(config: ModelConfig) -> int:
    """A Gated DeltaNet layer (in_proj_qkv/z/b/a, the conv, out_proj) or a KDA layer (q/k/v,
    the conv, low-rank forget gate and output gate, b_proj, o_proj); norms left out."""
    lin, h = config.linear_attention, config.hidden_size
    assert lin is not None
    value = lin.num_v_heads * lin.v_head_dim
    conv = lin.conv_channels * lin.conv_kernel
    if config.glm5_next is not None:
        low_rank = 2 * (h * lin.v_head_dim + lin.v_head_dim * value)  # f_a/f_b and g_a/g_b
        return h * lin.conv_channels + low_rank + h * lin.num_v_heads + conv + value * h
    return h * (lin.conv_channels + value + 2 * lin.num_v_heads) + conv + value * h


def _indexer_params(config: ModelConfig) -> int:
    """GLM-5.3's DSA indexer: wq_b, wk, weights_proj, the pool gate (mHC left out)."""
    glm, mla, h = config.glm5_next, config.mla, config.hidden_size
    assert glm is not None and mla is not None and mla.q_lora_rank is not None
    d = glm.index_head_dim
    return mla.q_lora_rank * glm.index_heads * d + 2 * h * d + h * glm.index_heads


def param_counts(config: ModelConfig) -> tuple[int, int]:
    """(non-embedding parameters read per token at batch 1, all non-embedding parameters)
    plus the LM head; an MoE layer reads `top_k` of its experts per token."""
    h = config.hidden_size
    full_attn = _attention_params(config)
    if config.glm5_next is not None:
        full_attn += _indexer_params(config)
    elif config.linear_attention is not None:  # Qwen3.5's q_proj also emits the output gate
        full_attn += h * config.q_size
    active = total = 0
    v4 = config.deepseek_v4
    for layer in range(config.num_layers):
        linear = config.layer_types[layer] == "linear"
        attn = _linear_attention_params(config) if linear else full_attn
        if v4 is not None:
            attn = _v4_layer_params(config, v4.attention[layer])
        if config.is_sparse(layer):
            assert config.moe is not None
            router = h * config.moe.num_experts + 3 * h * config.moe.shared_intermediate_size
            active += attn + router + config.moe.top_k * _expert_params(config)
            total += attn + router + config.moe.num_experts * _expert_params(config)
        else:
            active += attn + 3 * h * config.intermediate_size
            total += attn + 3 * h * config.intermediate_size
    head = config.vocab_size * h
    return active + head, total + head


def stored_bytes(config: ModelConfig, dtype_bytes: float = 2) -> tuple[float, float]:
    """(bytes per decoder-layer weight, bytes per expert weight) as the fast runner keeps
    them: FP8 one byte (its float32 scales add under 1%), MXFP4 experts 17 bytes per 32."""
    quant = config.quant
    if quant is None:
        return dtype_bytes, dtype_bytes
    if quant.scheme == "mxfp4":
        return dtype_bytes, 17 / 32
    return 1.0, 1.0


def weight_bytes_read(config: ModelConfig, batch: int, dtype_bytes: int = 2) -> int:
    """Weight bytes one step of `batch` tokens must read: all of a dense model; for an MoE the
    shared part plus the experts that uniform routing touches on average,
    E * (1 - (1 - k/E) ** batch) per sparse layer. Quantized weights (`config.quant`) count
    their stored bytes (`stored_bytes`); the LM head stays in `dtype_bytes`."""
    active, total = param_counts(config)
    head = config.vocab_size * config.hidden_size
    dense, expert = stored_bytes(config, dtype_bytes)
    if config.moe is None:
        return int(head * dtype_bytes + (total - head) * dense)
    moe = config.moe
    sparse = sum(config.is_sparse(i) for i in range(config.num_layers))
    shared = active - sparse * moe.top_k * _expert_params(config) - head
    touched = moe.num_experts * (1 - (1 - moe.top_k / moe.num_experts) ** batch)
    routed = sparse * touched * _expert_params(config) * expert
    return int(head * dtype_bytes + shared * dense + routed)


def checkpoint_bytes(config: ModelConfig, dtype_bytes: int = 2) -> int:
    """Bytes of the model's weights as its format stores them (`stored_bytes` per weight; the
    embedding and an untied LM head in `dtype_bytes`; norms, biases and FP8 scales, under 1%,
    left out): what a model built on one device should hold, to within a few percent."""
    _, total = param_counts(config)
    head = config.vocab_size * config.hidden_size
    embedding = 0 if config.tie_embeddings else head
    dense, expert = stored_bytes(config, dtype_bytes)
    experts = 0
    if config.moe is not None:
        sparse = sum(config.is_sparse(i) for i in range(config.num_layers))
        experts = sparse * config.moe.num_experts * _expert_params(config)
    rest = total - head - experts
    return int((head + embedding) * dtype_bytes + rest * dense + experts * expert)
