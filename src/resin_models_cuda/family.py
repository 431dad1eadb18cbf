"""The fast runner family (`cuda`), published under the `resin.runners` entry points: the
architectures of `architectures.py` on Triton kernels and CUDA graphs (bfloat16 unless asked;
the engine's row cap and longest sequence size the decode graphs and the rope table)."""

from __future__ import annotations

from dataclasses import replace

from resin.protocols import Runner
from resin_model.config import ModelConfig
from resin_model.family import BuildRequest, ModelSource, RunnerFamily
from resin_models_cuda.architectures import ARCHITECTURES


def build(source: ModelSource, request: BuildRequest) -> Runner:
    """A `CudaRunner` over a checkpoint folder, or random weights of a config."""
    import torch

    from resin_models_cuda.options import RunnerOptions
    from resin_models_cuda.runner import load_runner, random_runner

    options = RunnerOptions()
    if request.max_sequences is not None:
        options = replace(options, max_batch=request.max_sequences)
    if request.context_length is not None:
        options = replace(options, max_context=request.context_length)
    dtype = getattr(torch, request.dtype or "bfloat16")
    if isinstance(source, ModelConfig):
        return random_runner(source, options, request.device, dtype, request.seed)
    return load_runner(source, options, request.device, dtype)


FAMILY = RunnerFamily(
    "cuda", frozenset(ARCHITECTURES), build, "fast NVIDIA GPU runners (Triton, CUDA graphs)"
)
