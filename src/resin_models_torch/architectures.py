"""The reference runner's architectures: `model_type -> reference model class`, as
`module:Class` paths resolved on first use (so the family can say what it serves without
importing model code). Adding an architecture is one line here (and one in
`resin_models_cuda/architectures.py` when it has a fast model too)."""

from __future__ import annotations

from typing import Any

from resin_model.family import load_object

_LLAMA = "resin_models_torch.llama:LlamaForCausalLM"
_DEEPSEEK = "resin_models_torch.deepseek:DeepseekForCausalLM"
_QWEN3_5 = "resin_models_torch.qwen3_5_moe:Qwen3_5MoeForCausalLM"
_GLM5_NEXT = "resin_models_torch.glm5_next:Glm5NextForConditionalGeneration"

ARCHITECTURES: dict[str, str] = {
    "llama": _LLAMA,
    "mistral": _LLAMA,
    "qwen2": _LLAMA,
    "qwen3": _LLAMA,
    "qwen2_5_vl": "resin_models_torch.qwen2_5_vl:Qwen2_5_VLForConditionalGeneration",
    "qwen3_moe": "resin_models_torch.qwen3_moe:Qwen3MoeForCausalLM",
    "gemma3_text": "resin_models_torch.gemma3:Gemma3ForCausalLM",
    "gemma3": "resin_models_torch.gemma3_vision:Gemma3ForConditionalGeneration",
    "gpt_oss": "resin_models_torch.gpt_oss:GptOssForCausalLM",
    "olmo2": "resin_models_torch.olmo2:Olmo2ForCausalLM",
    "lfm2": "resin_models_torch.lfm2:Lfm2ForCausalLM",
    "deepseek_v2": _DEEPSEEK,
    "deepseek_v3": _DEEPSEEK,
    "deepseek_v4": "resin_models_torch.deepseek_v4:DeepseekV4ForCausalLM",
    "glm4_moe": "resin_models_torch.glm4_moe:Glm4MoeForCausalLM",
    "qwen3_5_moe": _QWEN3_5,
    "qwen3_5_moe_text": _QWEN3_5,
    "glm5_next": _GLM5_NEXT,
    "glm5_next_text": _GLM5_NEXT,
}


def reference_model(model_type: str) -> Any:
    """The reference `CausalLM` class of `model_type`."""
    if model_type not in ARCHITECTURES:
        raise ValueError(f"unknown model_type {model_type!r}; known: {sorted(ARCHITECTURES)}")
    return load_object(ARCHITECTURES[model_type])
