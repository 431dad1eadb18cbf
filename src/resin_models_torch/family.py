"""The reference runner family (`torch`), published under the `resin.runners` entry points:
every architecture of `architectures.py`, on any torch device (float32 on the CPU, bfloat16
elsewhere unless asked)."""

from __future__ import annotations

from typing import Any

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
        runner = random_runner(source, request.seed, request.device, dtype or torch.float32)
    else:
        runner = load_runner(source, device=request.device, dtype=dtype)
    if request.kv_cache_bytes is not None:
        runner.cache_bytes = request.kv_cache_bytes
    elif request.context_length is not None:
        runner.cache_bytes = max(runner.cache_bytes, sequence_bytes(runner, request.context_length))
    if not request.mtp:
        return runner
    from resin_models_torch.deepseek import DeepseekForCausalLM
    from resin_models_torch.deepseek_v4 import DeepseekV4ForCausalLM
    from resin_models_torch.mtp import MtpRunner

    model = runner.model
    if not isinstance(model, DeepseekForCausalLM | DeepseekV4ForCausalLM) or not model.mtp:
        raise ValueError("--speculative mtp needs a DeepSeek checkpoint with MTP layers")
    # One draft per step, as the fast runner; no overlap (plain steps between verify steps).
    return MtpRunner(model, num_drafts=1, overlap=False)


def sequence_bytes(runner: Any, context_length: int) -> int:
    """Arena bytes that hold one sequence of `context_length` tokens in every cache group
    (the arena's default grows to it, so the context a server reports is one the cache
    holds)."""
    rc = runner.runner_config
    width = -(-(context_length + 1) // rc.page_size)
    states = sum(g.state_region for g in rc.cache_groups)  # a two-page ring each
    tokens = len(rc.cache_groups) - states
    return int(width * tokens * rc.page_bytes + 2 * states * rc.state_page_bytes)


FAMILY = RunnerFamily(
    "torch", frozenset(ARCHITECTURES), build, "reference runners in plain PyTorch (any device)"
)
