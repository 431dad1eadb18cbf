"""CudaRunner against the reference runner (`resin_models_torch`) on the same weights: the
Engine drives both over the same requests (chunked prefill, prefix cache, batching) and they
produce the same greedy tokens; dense Llama and Qwen3-MoE (the expert-GEMV and sorted paths)."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
import torch

from resin import Engine, SamplingParams
from resin_models_cuda.config import ModelConfig, preset


def _generate(runner: object, prompts: list[list[int]]) -> list[list[int]]:
    params = SamplingParams(max_output_tokens=6, temperature=0.0, ignore_stop_tokens=True)
    with Engine(runner, context_length=100, prefix_cache=True, prefill_chunk_tokens=8,  # type: ignore[arg-type]
                max_batch_tokens=40, max_sequences=8) as engine:  # fmt: skip
        out = []
        for _ in range(2):  # the second round hits the prefix cache
            requests = [engine.submit(p, params) for p in prompts]
            while engine.has_work():
                engine.step()
            out.append([list(r.take_result()) for r in requests])
    assert out[0] == out[1]
    return out[0]


@pytest.mark.parametrize(
    "config",
    [preset("tiny"),
     replace(preset("tiny"), model_type="qwen3_moe", qk_norm=True, num_experts=6,
             experts_per_token=2, moe_intermediate_size=24)],
    ids=["llama", "qwen3_moe"],
)  # fmt: skip
def test_same_tokens_as_reference_runner(device: str, config: ModelConfig) -> None:
    from resin_models_cuda import CudaRunner, RunnerOptions
    from resin_models_cuda.weights import from_hf_state_dict
    from resin_models_torch.registry import random_runner

    reference = random_runner(config.to_hf(), seed=0, device=device, page_size=4, num_pages=96)
    with torch.no_grad():  # peakier logits than std 0.02, so greedy choices are not near-ties
        for name, p in reference.model.named_parameters():
            if "norm" not in name:
                p.mul_(8.0)
    sd = reference.model.state_dict()
    weights = from_hf_state_dict(sd.__getitem__, config, device, torch.float32)
    ours = CudaRunner(config, weights, RunnerOptions(page_size=4, max_batch=8, max_context=128,
                                                     num_pages=96))  # fmt: skip
    rng = np.random.default_rng(2)
    shared = rng.integers(0, config.vocab_size, size=11).tolist()
    prompts = [shared + rng.integers(0, config.vocab_size, size=n).tolist() for n in (1, 7, 19)]
    prompts.append(rng.integers(0, config.vocab_size, size=5).tolist())
    assert _generate(ours, prompts) == _generate(reference, prompts)
