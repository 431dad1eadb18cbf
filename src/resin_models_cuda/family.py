"""The fast runner family (`cuda`), published under the `resin.runners` entry points: the
architectures of `architectures.py` on Triton kernels and CUDA graphs (bfloat16 unless asked;
the engine's row cap and longest sequence size the decode graphs and the rope table).

On a CUDA device the KV arena is what `memory_fraction` of the free memory, measured before the
weights load, leaves once they are in: weights + arena take that share together, the rest is
for activations and graphs. An arena of no page is a `ValueError` naming the share."""

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
    from resin_models_cuda.runner import CudaRunner, load_model, random_runner

    options = RunnerOptions(cuda_graphs=request.cuda_graphs, mtp=request.mtp)
    if request.max_sequences is not None:
        options = replace(options, max_batch=request.max_sequences)
    if request.context_length is not None:
        options = replace(options, max_context=request.context_length)
    if request.memory_fraction is not None:
        options = replace(options, memory_fraction=request.memory_fraction)
    if request.graph_prefill_tokens is not None:
        options = replace(options, graph_prefill_tokens=request.graph_prefill_tokens)
    dtype = getattr(torch, request.dtype or "bfloat16")
    if isinstance(source, ModelConfig):  # random weights (`--load-format dummy`, benchmarks)
        if request.kv_cache_bytes is not None:
            options = replace(options, cache_bytes=request.kv_cache_bytes)
        return random_runner(source, options, request.device, dtype, request.seed)
    device = torch.device(request.device)
    free = torch.cuda.mem_get_info(device)[0] if device.type == "cuda" else None
    model = load_model(source, options, device, dtype)
    if request.kv_cache_bytes is not None:
        options = replace(options, cache_bytes=request.kv_cache_bytes)
    elif free is not None:
        options = replace(
            options, cache_bytes=arena_bytes(free, model.nbytes(), options.memory_fraction)
        )
    return CudaRunner(model, options)


def arena_bytes(free_before: int, weight_bytes: int, fraction: float) -> int:
    """The KV arena's bytes: `fraction` of `free_before` less the weights."""
    arena = int(free_before * fraction) - weight_bytes
    if arena <= 0:
        raise ValueError(
            f"the weights ({weight_bytes / 1e9:.2f} GB) leave no KV arena in "
            f"{fraction:g} of the free device memory ({free_before / 1e9:.2f} GB): raise "
            "--gpu-memory-utilization, or use a smaller model"
        )
    return arena


FAMILY = RunnerFamily(
    "cuda", frozenset(ARCHITECTURES), build, "fast NVIDIA GPU runners (Triton, CUDA graphs)"
)
