"""The Engine drives CudaRunner: chunked prefill, continuous batching and prefix caching give
the same greedy tokens as transformers on the same weights (tiny model; CPU through the Triton
interpreter in float32, or the GPU)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from resin import Engine, SamplingParams
from resin_models_cuda.config import preset


def test_engine_with_cuda_runner_matches_transformers(device: str) -> None:
    pytest.importorskip("transformers")
    from resin_models_cuda import CudaRunner, RunnerOptions, random_weights
    from resin_models_cuda.hf_baseline import build_hf_model

    config = preset("tiny")
    weights = random_weights(config, device, torch.float32, seed=0, std=0.2, embed_std=5)
    runner = CudaRunner(
        config, weights, RunnerOptions(page_size=4, max_batch=8, max_context=128, num_pages=96)
    )
    rng = np.random.default_rng(5)
    shared = rng.integers(0, config.vocab_size, size=13).tolist()
    prompts = [shared + rng.integers(0, config.vocab_size, size=n).tolist() for n in (2, 9, 20)]
    prompts.append(rng.integers(0, config.vocab_size, size=6).tolist())
    params = SamplingParams(max_output_tokens=6, temperature=0.0, ignore_stop_tokens=True)
    hf = build_hf_model(config, weights)
    hf.generation_config.eos_token_id = None  # generate exactly 6 tokens, like the engine
    expect = []
    for p in prompts:
        out = hf.generate(torch.tensor([p], device=device), max_new_tokens=6, do_sample=False)
        expect.append(out[0, len(p) :].tolist())
    with Engine(runner, context_length=100, prefix_cache=True, prefill_chunk_tokens=8,
                max_batch_tokens=24, max_sequences=8) as engine:  # fmt: skip
        for _ in range(2):  # the second round reuses the cached prefixes
            requests = [engine.submit(p, params) for p in prompts]
            while engine.has_work():
                engine.step()
            assert [list(r.take_result()) for r in requests] == expect
