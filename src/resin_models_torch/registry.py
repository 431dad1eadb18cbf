"""Pick the reference model (from `architectures.ARCHITECTURES`) for a checkpoint's
`model_type` and build a ready `TorchRunner`.

`load_runner(folder)` reads a Hugging Face style folder (config.json + *.safetensors; the GGUF
converter writes such folders too); `random_runner(config)` builds one with random weights for
tests and benchmarks.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from resin_model.config import ModelConfig
from resin_model.hf_config import load_config, parse_config
from resin_model.nn import RMSNorm
from resin_models_torch.architectures import ARCHITECTURES, reference_model
from resin_models_torch.base import CausalLM
from resin_models_torch.layers import keep_float32
from resin_models_torch.loader import load_weights
from resin_models_torch.runner import TorchRunner


def build_model(
    config: ModelConfig, device: str | torch.device = "cpu", dtype: torch.dtype = torch.float32
) -> CausalLM:
    """An uninitialised-weights model of the right architecture on `device` in `dtype`."""
    if config.model_type not in ARCHITECTURES:
        raise ValueError(f"no reference model for model_type {config.model_type!r}")
    with torch.device(device):
        model: CausalLM = reference_model(config.model_type)(config)
    return keep_float32(model.to(dtype=dtype))


def load_model(
    folder: str | Path, device: str | torch.device = "cpu", dtype: torch.dtype | None = None
) -> CausalLM:
    """Build the model for `folder` and load its weights (dtype defaults to float32 on CPU,
    bfloat16 elsewhere)."""
    config = load_config(folder)
    if dtype is None:
        dtype = torch.float32 if torch.device(device).type == "cpu" else torch.bfloat16
    model = build_model(config, device, dtype)
    load_weights(
        model,
        folder,
        model.checkpoint_name,
        config.quant,
        model.split_tensor,
        model.optional_missing,
    )
    return model


def load_runner(
    folder: str | Path,
    device: str | torch.device = "cpu",
    dtype: torch.dtype | None = None,
    **runner_kwargs: Any,
) -> TorchRunner:
    """A `TorchRunner` for a checkpoint folder; `runner_kwargs` go to `TorchRunner`
    (page_size, cache_bytes, num_pages, seed)."""
    return TorchRunner(load_model(folder, device, dtype), **runner_kwargs)


def random_runner(
    config: ModelConfig | dict[str, Any],
    seed: int = 0,
    device: str | torch.device = "cpu",
    dtype: torch.dtype = torch.float32,
    **runner_kwargs: Any,
) -> TorchRunner:
    """A runner with random weights (normal, std 0.02; norms at identity) for tests."""
    if isinstance(config, dict):
        config = parse_config(config)
    torch.manual_seed(seed)
    model = build_model(config, device, dtype)
    with torch.no_grad():
        for param in model.parameters():
            param.normal_(0.0, 0.02)
        for module in model.modules():
            if isinstance(module, RMSNorm):
                module.weight.fill_(0.0 if module.unit_offset else 1.0)
    return TorchRunner(model, **runner_kwargs)
