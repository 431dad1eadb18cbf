"""A Hugging Face transformers model on the very same weight memory (baseline and oracle).

The model is built on the meta device and handed views of the runner's fused weights under
Hugging Face names (`assign=True`: no copy), so the baseline costs no extra weight memory and
compares like with like. Dense models only. transformers is imported lazily (dev dependency).
"""

from __future__ import annotations

from typing import Any

import torch

from resin_models_cuda.config import ModelConfig
from resin_models_cuda.weights import ModelWeights, to_hf_state_dict


def build_hf_model(config: ModelConfig, weights: ModelWeights) -> Any:
    """A `transformers` causal LM in eval mode sharing `weights`' memory."""
    import transformers

    raw = config.to_hf()
    hf_config = transformers.AutoConfig.for_model(raw.pop("model_type"), **raw)
    device = weights.embed.device
    with torch.device("meta"):
        auto = transformers.AutoModelForCausalLM
        model = auto.from_config(hf_config, dtype=weights.embed.dtype)  # type: ignore[no-untyped-call]
    result = model.load_state_dict(to_hf_state_dict(weights, config), strict=False, assign=True)
    missing = [k for k in result.missing_keys if not k.endswith("lm_head.weight")]
    if missing or result.unexpected_keys:
        raise RuntimeError(f"weight names do not match: {missing} {result.unexpected_keys}")
    if config.tie_word_embeddings:
        model.lm_head.weight = model.model.embed_tokens.weight
    # Non-persistent buffers (rotary inverse frequencies) are still on meta: rebuild them.
    for name, module in list(model.named_modules()):
        if hasattr(module, "inv_freq"):
            parent = model.get_submodule(name.rsplit(".", 1)[0]) if "." in name else model
            setattr(parent, name.rsplit(".", 1)[-1], type(module)(config=hf_config).to(device))
    return model.eval()
