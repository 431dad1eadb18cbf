"""End to end: the Engine driving the reference PyTorch runner generates exactly what
`transformers` greedy decoding does, for a History, a sliding-window hybrid and a
conv-state hybrid architecture, with prefix caching on and off (shared prefixes, chunked
prefill, several requests per step)."""

from __future__ import annotations

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from resin import Engine, SamplingParams
from resin_models_torch.registry import load_runner
from tests.models.ref_compare import hf_greedy
from tests.models.ref_hf import checkpoint


@pytest.mark.parametrize("prefix_cache", [False, True], ids=["plain", "prefix"])
@pytest.mark.parametrize("arch", ["llama3", "gemma3", "lfm2"])
def test_engine_with_reference_runner_equals_transformers(arch: str, prefix_cache: bool) -> None:
    folder, hf = checkpoint(arch)
    runner = load_runner(folder, page_size=4)
    engine = Engine(
        runner,
        context_length=128,
        prefix_cache=prefix_cache,
        prefill_chunk_tokens=8,
        max_batch_tokens=24,
    )
    shared = [(7 * i + 11) % 300 for i in range(18)]
    prompts = [shared + [(13 * j + k) % 300 for k in range(3 + j)] for j in range(4)]
    params = SamplingParams(max_output_tokens=6, temperature=0.0)
    first = engine.submit(prompts[0], params)
    while not first.output_token_ids:
        engine.step()
    rest = [engine.submit(p, params) for p in prompts[1:]]
    while engine.has_work():
        engine.step()
        engine.check_invariants()
    for request, prompt in zip([first, *rest], prompts, strict=True):
        assert request.take_result() == hf_greedy(hf, prompt, 6), f"{arch} request {request.id}"
    if prefix_cache:
        assert all(r.cached_tokens >= 16 for r in rest), [r.cached_tokens for r in rest]
