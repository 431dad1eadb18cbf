"""The reference runner family (`torch`), published under the `resin.runners` entry points:
every architecture of `architectures.py`, on any torch device (float32 on the CPU, bfloat16
elsewhere unless asked)."""

from __future__ import annotations

from resin.protocols import Runner
from resin_model.config import ModelConfig
from resin_model.family import BuildRequest, ModelSource, RunnerFamily
from resin_models_torch.architectures import ARCHITECTURES


def build(source: ModelSource, request: BuildRequest) -> Runner:
    """A `TorchRunner` over a checkpoint folder, or random weights of a config."""
    import torch

    from resin_models_torch.registry import load_runner, random_runner

    dtype = None if request.dtype is None else getattr(torch, request.dtype)
    if isinstance(source, ModelConfig):
        return random_runner(source, request.seed, request.device, dtype or torch.float32)
    return load_runner(source, device=request.device, dtype=dtype)


FAMILY = RunnerFamily(
    "torch", frozenset(ARCHITECTURES), build, "reference runners in plain PyTorch (any device)"
)
