"""The fast runner's architectures: `model_type -> fast model class`, as `module:Class` paths
resolved on first use, and `build_model`, which builds a config's. Adding a fast architecture
is one line here."""

from __future__ import annotations

from typing import Any

from resin_model.config import ModelConfig
from resin_model.family import load_object
from resin_models_cuda.layers import WeightSource
from resin_models_cuda.models.base import BuildOptions, FastModel

_LLAMA = "resin_models_cuda.models.llama:Llama"
_DEEPSEEK = "resin_models_cuda.models.deepseek:Deepseek"
_QWEN3_5 = "resin_models_cuda.models.qwen3_5_moe:Qwen3_5Moe"
_GLM5 = "resin_models_cuda.models.glm5_next:Glm5Next"

ARCHITECTURES: dict[str, str] = {
    "llama": _LLAMA,
    "mistral": _LLAMA,
    "qwen2": _LLAMA,
    "qwen3": _LLAMA,
    "qwen3_moe": _LLAMA,
    "gemma3_text": "resin_models_cuda.models.gemma3:Gemma3",
    "gemma3": "resin_models_cuda.models.gemma3:Gemma3Vision",
    "gpt_oss": "resin_models_cuda.models.gpt_oss:GptOss",
    "olmo2": "resin_models_cuda.models.olmo2:Olmo2",
    "deepseek_v2": _DEEPSEEK,
    "deepseek_v3": _DEEPSEEK,
    "glm4_moe": "resin_models_cuda.models.glm4_moe:Glm4Moe",
    "deepseek_v4": "resin_models_cuda.models.deepseek_v4:DeepseekV4",
    "glm5_next": _GLM5,
    "glm5_next_text": _GLM5,
    "qwen3_5_moe": _QWEN3_5,
    "qwen3_5_moe_text": _QWEN3_5,
}


def fast_model(model_type: str) -> Any:
    """The fast model class of `model_type`."""
    if model_type not in ARCHITECTURES:
        raise ValueError(
            f"model_type {model_type!r} has no fast (resin_models_cuda) model; "
            f"known: {sorted(ARCHITECTURES)}"
        )
    return load_object(ARCHITECTURES[model_type])


def build_model(
    config: ModelConfig, weights: WeightSource, options: BuildOptions | None = None
) -> FastModel:
    """The fast model of `config.model_type`, its weights taken from `weights`."""
    model: FastModel = fast_model(config.model_type)(config, weights, options or BuildOptions())
    return model
