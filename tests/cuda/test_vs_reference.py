"""Every architecture's fast model against its reference model on the same weights: the Engine
drives `CudaRunner` and the reference `TorchRunner` over the same requests (batching, chunked
prefill, prefix-cache hits, sliding-window page release with windows shorter than the
prompts) and they produce the same greedy tokens, in float32. On CPU the kernels run in the
Triton interpreter; on a GPU the same test runs the compiled kernels."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch

from resin import Engine, SamplingParams
from resin_model.presets import TINY

MOE = ("qwen3_moe", "gpt_oss")


def _generate(runner: object, prompts: list[list[int]], tokens: int) -> list[list[int]]:
    params = SamplingParams(max_output_tokens=tokens, temperature=0.0, ignore_stop_tokens=True)
    with Engine(
        runner,
        context_length=100,
        prefix_cache=True,
        prefill_chunk_tokens=8,  # type: ignore[arg-type]
        max_batch_tokens=40,
        max_sequences=8,
    ) as engine:
        out = []
        for _ in range(2):  # the second round hits the prefix cache
            requests = [engine.submit(p, params) for p in prompts]
            while engine.has_work():
                engine.step()
            out.append([list(r.take_result()) for r in requests])
    assert out[0] == out[1]
    return out[0]


def reference_and_fast(
    raw: dict[str, Any], device: str, gemv_max_pairs: int = 64, dtype: torch.dtype = torch.float32
) -> tuple[Any, Any]:
    """A reference runner with peaky random weights and the fast runner on the same tensors."""
    from resin_model.hf_config import parse_config
    from resin_models_cuda import CudaRunner, RunnerOptions, build_model
    from resin_models_cuda.layers import StateDictWeights
    from resin_models_torch.registry import random_runner

    reference = random_runner(raw, seed=0, device=device, dtype=dtype, page_size=4, num_pages=160)
    with torch.no_grad():  # peakier logits than std 0.02, so greedy choices are not near-ties
        for name, p in reference.model.named_parameters():
            if "norm" not in name:
                p.mul_(8.0)
            elif p.abs().max() == 0:  # Gemma's (1 + w) norms: exercise w too
                p.normal_(0.0, 0.1)
    options = RunnerOptions(
        page_size=4, max_batch=8, max_context=128, num_pages=160, moe_gemv_max_pairs=gemv_max_pairs
    )
    source = StateDictWeights(reference.model.state_dict(), device, dtype)
    fast = CudaRunner(build_model(parse_config(raw), source, options.build_options()), options)
    return reference, fast


def _prompts(vocab: int, full: bool) -> list[list[int]]:
    """A shared 11-token prefix (prefix hits), prompts longer than every window (window page
    release), a short unrelated one; fewer on CPU, where the interpreter pays per program."""
    rng = np.random.default_rng(2)
    shared = rng.integers(0, vocab, size=11).tolist()
    tails = (1, 7, 19) if full else (2, 15)
    prompts = [shared + rng.integers(0, vocab, size=n).tolist() for n in tails]
    prompts.append(rng.integers(0, vocab, size=5).tolist())
    return prompts


HAS_CUDA = torch.cuda.is_available()
# The grouped-GEMM variants of the MoE models run on the GPU only (CPU CI time); the MoE kernel
# tests cover both paths on CPU.
CASES = [(arch, 64) for arch in sorted(TINY)] + [(arch, 0) for arch in MOE if HAS_CUDA]


@pytest.mark.parametrize(
    ("arch", "gemv_max_pairs"),
    CASES,
    ids=[f"{a}-gemv" if a in MOE and g else a if g else f"{a}-grouped" for a, g in CASES],
)
def test_same_tokens_as_reference_runner(device: str, arch: str, gemv_max_pairs: int) -> None:
    reference, fast = reference_and_fast(TINY[arch], device, gemv_max_pairs)
    prompts = _prompts(256, full=HAS_CUDA)
    tokens = 6 if HAS_CUDA else 3
    assert _generate(fast, prompts, tokens) == _generate(reference, prompts, tokens)
