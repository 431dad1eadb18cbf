"""The one registry of architectures: `model_type -> (reference model, fast model)`.

This is the model-description module both runner families share (with `config.py`): the
reference runner (`resin_models_torch`) and the fast runner (`resin_models_cuda`) look their
model class up here, so adding an architecture is one line. Entries are `module:Class` paths
resolved on first use, so importing this module imports neither family's model code (and never
Triton).
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class Architecture:
    """Where the two implementations of one `model_type` live (`fast` None: reference only)."""

    reference: str
    fast: str | None = None


_LLAMA = Architecture(
    "resin_models_torch.llama:LlamaForCausalLM", "resin_models_cuda.models.llama:Llama"
)

_DEEPSEEK = Architecture(
    "resin_models_torch.deepseek:DeepseekForCausalLM", "resin_models_cuda.models.deepseek:Deepseek"
)

ARCHITECTURES: dict[str, Architecture] = {
    "llama": _LLAMA,
    "mistral": _LLAMA,
    "qwen2": _LLAMA,
    "qwen3": _LLAMA,
    "qwen2_5_vl": Architecture("resin_models_torch.qwen2_5_vl:Qwen2_5_VLForConditionalGeneration"),
    "qwen3_moe": Architecture(
        "resin_models_torch.qwen3_moe:Qwen3MoeForCausalLM", "resin_models_cuda.models.llama:Llama"
    ),
    "gemma3_text": Architecture(
        "resin_models_torch.gemma3:Gemma3ForCausalLM", "resin_models_cuda.models.gemma3:Gemma3"
    ),
    "gemma3": Architecture(
        "resin_models_torch.gemma3_vision:Gemma3ForConditionalGeneration",
        "resin_models_cuda.models.gemma3:Gemma3Vision",
    ),
    "gpt_oss": Architecture(
        "resin_models_torch.gpt_oss:GptOssForCausalLM", "resin_models_cuda.models.gpt_oss:GptOss"
    ),
    "olmo2": Architecture(
        "resin_models_torch.olmo2:Olmo2ForCausalLM", "resin_models_cuda.models.olmo2:Olmo2"
    ),
    "lfm2": Architecture("resin_models_torch.lfm2:Lfm2ForCausalLM"),
    "deepseek_v2": _DEEPSEEK,
    "deepseek_v3": _DEEPSEEK,
}


def _architecture(model_type: str) -> Architecture:
    if model_type not in ARCHITECTURES:
        raise ValueError(f"unknown model_type {model_type!r}; known: {sorted(ARCHITECTURES)}")
    return ARCHITECTURES[model_type]


def _resolve(path: str) -> Any:
    module, name = path.split(":")
    return getattr(importlib.import_module(module), name)


def reference_model(model_type: str) -> Any:
    """The reference `CausalLM` class of `model_type`."""
    return _resolve(_architecture(model_type).reference)


def fast_model(model_type: str) -> Any:
    """The fast model class of `model_type` (imports `resin_models_cuda`, hence Triton)."""
    fast = _architecture(model_type).fast
    if fast is None:
        raise ValueError(f"model_type {model_type!r} has no fast (resin_models_cuda) model yet")
    return _resolve(fast)
