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
    model.save_pretrained(folder)
    return model


_ROOT = Path(tempfile.mkdtemp(prefix="resin-tiny-"))
atexit.register(shutil.rmtree, _ROOT, ignore_errors=True)


@functools.cache
def checkpoint(arch: str) -> tuple[Path, Any]:
    """`(folder, hf_model)` of the tiny `arch` model, built once per test process."""
    folder = _ROOT / arch
    return folder, save_tiny(arch, folder)
