"""Qwen3.5 (`qwen3_5_moe`) on the fast runner against the reference runner, in float32, on a
tiny random model built with transformers' own class and saved as a folder (both runners load
that folder): the Engine drives each over the same requests with 8-token prefill chunks
(State checkpoints inside chunks), decode, and a second round that resumes from the State
checkpoints of the shared prefix (prefix-cache hits), and they produce the same greedy tokens.
The shared expert runs fused into the routed experts (its width a multiple of theirs) or as
its own MLP. On CPU the kernels run in the Triton interpreter."""

from __future__ import annotations

import functools
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import transformers

from resin import Engine, SamplingParams
from resin.protocols import State

_ROOT = Path(tempfile.mkdtemp(prefix="resin-fast-qwen3_5-"))

_TEXT: dict[str, Any] = dict(
    vocab_size=128,
    hidden_size=32,
    num_hidden_layers=4,  # three linear-attention layers, then full attention
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    linear_num_key_heads=2,
    linear_num_value_heads=4,
    linear_key_head_dim=16,
    linear_value_head_dim=8,
    moe_intermediate_size=16,
    num_experts=4,
    num_experts_per_tok=2,
    initializer_range=0.2,
    rope_parameters={"rope_type": "default", "rope_theta": 10000.0,
                     "partial_rotary_factor": 0.5, "mrope_section": [2, 1, 1]},
)  # fmt: skip


@functools.cache
def tiny(shared: int) -> Path:
    """A saved tiny model whose shared expert is `shared` wide, with non-trivial norms and
    decays that keep the recurrent state alive over the prompt."""
    torch.manual_seed(0)
    config = transformers.Qwen3_5MoeTextConfig(**_TEXT, shared_expert_intermediate_size=shared)
    model = transformers.Qwen3_5MoeForCausalLM(config)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "norm" in name:
                param.add_(torch.randn_like(param) * 0.1)
            if name.endswith("A_log"):
                param.copy_(torch.empty_like(param).uniform_(0.02, 0.5).log())
    folder = _ROOT / f"shared{shared}"
    model.save_pretrained(folder)
    return folder


def _generate(runner: object, prompts: list[list[int]]) -> tuple[list[list[int]], int]:
    """Greedy tokens of two rounds over `prompts` (the second resumes from the first's
    cached prefixes), and the prefix tokens the second round reused."""
    params = SamplingParams(max_output_tokens=3, temperature=0.0, ignore_stop_tokens=True)
    with Engine(runner, context_length=64, prefix_cache=True, prefill_chunk_tokens=8,  # type: ignore[arg-type]
                max_batch_tokens=24, max_sequences=4) as engine:  # fmt: skip
        rounds, reused = [], 0
        for _ in range(2):
            requests = [engine.submit(p, params) for p in prompts]
            while engine.has_work():
                engine.step()
                engine.check_invariants()
            rounds.append([list(r.take_result()) for r in requests])
            reused = sum(r.cached_tokens for r in requests)
    assert rounds[0] == rounds[1]
    return rounds[0], reused


@pytest.mark.parametrize("shared", [16, 24], ids=["shared-fused", "shared-mlp"])
def test_same_tokens_as_reference_runner(device: str, shared: int) -> None:
    from resin_models_cuda import RunnerOptions, load_runner
    from resin_models_torch.registry import load_runner as load_reference

    folder = tiny(shared)
    reference = load_reference(folder, page_size=4, num_pages=96, device=device)
    options = RunnerOptions(page_size=4, max_batch=4, max_context=64, num_pages=96)
    fast = load_runner(folder, options, device, torch.float32)
    assert isinstance(fast.runner_config.cache_groups[-1], State)
    assert fast.runner_config.max_draft_tokens == 0  # a State group is not rewound
    rng = np.random.default_rng(3)
    shared_prefix = rng.integers(0, 128, size=10).tolist()
    prompts = [shared_prefix + rng.integers(0, 128, size=n).tolist() for n in (3, 6)]
    prompts.append(rng.integers(0, 128, size=5).tolist())
    want, reused_ref = _generate(reference, prompts)
    got, reused = _generate(fast, prompts)
    assert got == want
    assert reused == reused_ref and reused >= 16  # the second round resumed at 8 tokens
