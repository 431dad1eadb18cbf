"""Tiny random Hugging Face models (one per supported architecture) saved to a folder, so the
same weights can be loaded by Resin's loader and compared with `transformers` itself."""

from __future__ import annotations

import atexit
import functools
import shutil
import tempfile
from pathlib import Path
from typing import Any

import torch
import transformers

torch.set_num_threads(1)

_COMMON: dict[str, Any] = dict(
    vocab_size=300,
    hidden_size=64,
    intermediate_size=128,
    num_attention_heads=4,
    num_key_value_heads=2,
    initializer_range=0.1,
    bos_token_id=None,
    eos_token_id=None,
    pad_token_id=None,
)


def _yarn(**mscales: float) -> dict[str, Any]:
    return {"rope_type": "yarn", "factor": 4.0, "rope_theta": 10000.0, "beta_fast": 32.0,
            "beta_slow": 1.0, "original_max_position_embeddings": 16, **mscales}  # fmt: skip


_DEEPSEEK: dict[str, Any] = dict(
    num_hidden_layers=3,
    num_key_value_heads=4,
    kv_lora_rank=32,
    qk_rope_head_dim=8,
    qk_nope_head_dim=16,
    v_head_dim=16,
    n_routed_experts=8,
    num_experts_per_tok=3,
    moe_intermediate_size=32,
    n_shared_experts=1,
    first_k_dense_replace=1,
    max_position_embeddings=64,
)

_GLM: dict[str, Any] = dict(
    num_hidden_layers=2,
    head_dim=16,
    attention_bias=True,
    moe_intermediate_size=32,
    n_routed_experts=8,
    num_experts_per_tok=3,
    n_shared_experts=1,
    first_k_dense_replace=1,
    num_mtp_layers=1,
    max_position_embeddings=64,
)

ARCHS: dict[str, tuple[str, str, dict[str, Any]]] = {
    "llama3": (
        "LlamaConfig",
        "LlamaForCausalLM",
        dict(
            num_hidden_layers=2,
            rope_scaling={
                "rope_type": "llama3",
                "factor": 8.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": 32,
            },
        ),
    ),
    "smollm2": (
        "LlamaConfig",
        "LlamaForCausalLM",
        dict(num_hidden_layers=2, tie_word_embeddings=True),
    ),
    "mistral": (
        "MistralConfig",
        "MistralForCausalLM",
        dict(num_hidden_layers=2, sliding_window=7, head_dim=16),
    ),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM", dict(num_hidden_layers=2)),
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM", dict(num_hidden_layers=2, head_dim=16)),
    "gemma3": (
        "Gemma3TextConfig",
        "Gemma3ForCausalLM",
        dict(
            num_hidden_layers=3,
            head_dim=16,
            sliding_window=6,
            layer_types=["sliding_attention", "full_attention", "sliding_attention"],
            query_pre_attn_scalar=16,
            final_logit_softcapping=30.0,
        ),
    ),
    "lfm2": (
        "Lfm2Config",
        "Lfm2ForCausalLM",
        dict(num_hidden_layers=3, full_attn_idxs=[1], block_multiple_of=32, conv_L_cache=3),
    ),
    "qwen3_moe": (
        "Qwen3MoeConfig",
        "Qwen3MoeForCausalLM",
        dict(
            num_hidden_layers=2,
            head_dim=16,
            moe_intermediate_size=32,
            num_experts=6,
            num_experts_per_tok=2,
            norm_topk_prob=True,
            mlp_only_layers=[1],
        ),
    ),
    "gpt_oss": (
        "GptOssConfig",
        "GptOssForCausalLM",
        dict(
            num_hidden_layers=2,
            head_dim=16,
            intermediate_size=32,
            num_local_experts=6,
            num_experts_per_tok=2,
            sliding_window=5,
            rope_parameters={
                "rope_type": "yarn",
                "factor": 4.0,
                "beta_fast": 32.0,
                "beta_slow": 1.0,
                "truncate": False,
                "rope_theta": 10000.0,
                "original_max_position_embeddings": 16,
            },
        ),
    ),
    "olmo2": ("Olmo2Config", "Olmo2ForCausalLM", dict(num_hidden_layers=2)),
    # V3 style: q LoRA, YaRN with DeepSeek's mscale pair, sigmoid routing with a correction
    # bias over 4 groups (2 kept), a dense first layer, one shared expert, scaled weights.
    "deepseek_v3": (
        "DeepseekV3Config",
        "DeepseekV3ForCausalLM",
        dict(
            _DEEPSEEK,
            num_mtp_layers=0,
            q_lora_rank=24,
            n_group=4,
            topk_group=2,
            routed_scaling_factor=2.5,
            rope_parameters=_yarn(mscale=1.0, mscale_all_dim=0.8),
        ),
    ),
    # V3 without q LoRA, rotate-half rotary, one group, unnormalised weights.
    "deepseek_v3_plain": (
        "DeepseekV3Config",
        "DeepseekV3ForCausalLM",
        dict(
            _DEEPSEEK,
            num_mtp_layers=0,
            q_lora_rank=None,
            n_group=1,
            topk_group=1,
            rope_interleave=False,
            norm_topk_prob=False,
            routed_scaling_factor=1.5,
            first_k_dense_replace=0,
        ),
    ),
    # V2-Lite style: no q LoRA, softmax greedy routing, two shared experts, YaRN mscale 0.707.
    "deepseek_v2": (
        "DeepseekV2Config",
        "DeepseekV2ForCausalLM",
        dict(
            _DEEPSEEK,
            q_lora_rank=None,
            n_shared_experts=2,
            topk_method="greedy",
            rope_parameters=_yarn(mscale=0.707, mscale_all_dim=0.707),
        ),
    ),
    # V2 with q LoRA and group_limited_greedy routing.
    "deepseek_v2_grouped": (
        "DeepseekV2Config",
        "DeepseekV2ForCausalLM",
        dict(
            _DEEPSEEK,
            q_lora_rank=16,
            topk_method="group_limited_greedy",
            n_group=4,
            topk_group=2,
            routed_scaling_factor=16.0,
        ),
    ),
    # GLM-4.5 style: partial rotary (half of each head), q/k norm, q/k/v bias, a dense first
    # layer, sigmoid routing with the correction bias over 2 groups (1 kept), scaled weights.
    "glm4_moe": (
        "Glm4MoeConfig",
        "Glm4MoeForCausalLM",
        dict(_GLM, use_qk_norm=True, n_group=2, topk_group=1, routed_scaling_factor=2.5),
    ),
    # GLM-4.5-Air style: no q/k norm, one group, unnormalised weights, a quarter of each head
    # rotated.
    "glm4_moe_air": (
        "Glm4MoeConfig",
        "Glm4MoeForCausalLM",
        dict(_GLM, use_qk_norm=False, norm_topk_prob=False, partial_rotary_factor=0.25),
    ),
}


def save_tiny(arch: str, folder: Path, seed: int = 0) -> Any:
    """Build the tiny HF model of `arch` with seeded random weights, save it, return it."""
    config_cls, model_cls, extra = ARCHS[arch]
    config = getattr(transformers, config_cls)(**{**_COMMON, **extra})
    torch.manual_seed(seed)
    model = getattr(transformers, model_cls)(config).eval()
    with torch.no_grad():  # give norms and biases non-trivial values so they are exercised
        for name, param in model.named_parameters():
            if "norm" in name or name.endswith(".bias"):
                param.add_(torch.randn_like(param) * 0.1)
        for name, buffer in model.named_buffers():  # DeepSeek V3's routing bias is a buffer
            if name.endswith("e_score_correction_bias"):
                buffer.add_(torch.randn_like(buffer) * 0.1)
    model.save_pretrained(folder)
    return model


_ROOT = Path(tempfile.mkdtemp(prefix="resin-tiny-"))
atexit.register(shutil.rmtree, _ROOT, ignore_errors=True)


@functools.cache
def checkpoint(arch: str) -> tuple[Path, Any]:
    """`(folder, hf_model)` of the tiny `arch` model, built once per test process."""
    folder = _ROOT / arch
    return folder, save_tiny(arch, folder)
