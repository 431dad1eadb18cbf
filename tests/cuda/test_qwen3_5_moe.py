"""Qwen3.5 (`qwen3_5_moe`) on the fast runner against the reference runner, in float32, on a
tiny random model built with transformers' own class and saved as a folder (both runners load
that folder): the Engine drives each over the same requests with 8-token prefill chunks
(State checkpoints inside chunks), decode, and a second round that resumes from the State
checkpoints of the shared prefix (prefix-cache hits), and they produce the same greedy tokens.
The shared expert runs fused into the routed experts (its width a multiple of theirs) or as
its own MLP (there prefill runs the recurrent delta-rule kernel, elsewhere the chunked
one). On CPU the kernels run in the Triton interpreter. Held out: the prefix-hit ratio of
64 requests sharing a 1,024-token prefix on the fast runner's cache layout for the real
shapes equals a pure-attention layout's."""

from __future__ import annotations

import functools
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import torch
import transformers

from resin import Engine, SamplingParams
from resin.protocols import State

_ROOT = Path(tempfile.mkdtemp(prefix="resin-fast-qwen3_5-"))

_TEXT: dict[str, Any] = dict(
    vocab_size=128,
    hidden_size=32,
    num_hidden_layers=2,
    layer_types=["linear_attention", "full_attention"],
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


def _generate(
    runner: object, prompts: list[list[int]], rounds: int = 2, tokens: int = 3
) -> tuple[list[list[int]], int]:
    """Greedy tokens of `rounds` rounds over `prompts` (each after the first resumes from the
    cached prefixes), and the prefix tokens the last round reused."""
    params = SamplingParams(max_output_tokens=tokens, temperature=0.0, ignore_stop_tokens=True)
    with Engine(runner, context_length=64, prefix_cache=True, prefill_chunk_tokens=8,  # type: ignore[arg-type]
                max_batch_tokens=24, max_sequences=4) as engine:  # fmt: skip
        outputs, reused = [], 0
        for _ in range(rounds):
            requests = [engine.submit(p, params) for p in prompts]
            while engine.has_work():
                engine.step()
                engine.check_invariants()
            outputs.append([list(r.take_result()) for r in requests])
            reused = sum(r.cached_tokens for r in requests)
    assert all(out == outputs[0] for out in outputs)
    return outputs[0], reused


def _runners(device: str, shared: int) -> tuple[Any, Any]:
    from resin_models_cuda import RunnerOptions, load_runner
    from resin_models_torch.registry import load_runner as load_reference

    folder = tiny(shared)
    reference = load_reference(folder, page_size=4, num_pages=96, device=device)
    options = RunnerOptions(page_size=4, max_batch=4, max_context=64, num_pages=96)
    return reference, load_runner(folder, options, device, torch.float32)


def _prompts() -> list[list[int]]:
    """Two prompts of 13 and 16 tokens sharing a 10-token prefix."""
    rng = np.random.default_rng(3)
    shared = rng.integers(0, 128, size=10).tolist()
    return [shared + rng.integers(0, 128, size=n).tolist() for n in (3, 6)]


def test_same_tokens_as_reference_runner_with_prefix_hits(device: str) -> None:
    reference, fast = _runners(device, 16)  # the shared expert fused into the routed ones
    assert isinstance(fast.runner_config.cache_groups[-1], State)
    assert fast.runner_config.max_draft_tokens == 0  # a State group is not rewound
    want, reused_ref = _generate(reference, _prompts())
    got, reused = _generate(fast, _prompts())
    assert got == want
    assert reused == reused_ref == 24  # the second round resumed both rows at 12 tokens


def test_separate_shared_expert_mlp_and_recurrent_prefill(device: str) -> None:
    from resin_models_cuda.models.qwen3_5_moe import GatedDeltaNet

    reference, fast = _runners(device, 24)  # 24 is no multiple of the experts' 16
    for layer in fast.model.layers:
        if isinstance(layer.mixer, GatedDeltaNet):
            layer.mixer.prefill_chunk = 0  # prefill through the recurrent delta-rule kernel
    prompt = _prompts()[1:]
    assert _generate(fast, prompt, 1, 2) == _generate(reference, prompt, 1, 2)


def test_shared_prefix_hits_on_the_fast_runners_layout() -> None:
    """Held out (issue 37): 64 requests sharing a 1,024-token prefix, on the cache groups and
    page bytes the fast runner declares for Qwen3.5-35B-A3B's cache shapes (a State page of
    61.4 MiB beside 320 KiB History pages) in a 60 GB arena, hit the cache as often as a
    pure-attention layout of the same History pages and bytes. The engine drives a runner
    that simulates the model through the cache (`CacheSimRunner`)."""
    from dataclasses import replace

    from resin_model.presets import preset
    from resin_models_cuda import CudaRunner, RunnerOptions, build_model
    from resin_models_cuda.layers import RandomWeights
    from tests.models.ref_compare import assert_layout_hits_like_attention

    # The real attention and linear-attention shapes; hidden, experts and vocabulary shrunk.
    real = preset("qwen3.5-35b-a3b")
    moe = replace(real.moe, num_experts=2, top_k=1) if real.moe else None
    config = replace(real, hidden_size=16, vocab_size=300, moe=moe)
    model = build_model(config, RandomWeights("cpu", torch.bfloat16))
    layout = CudaRunner(model, RunnerOptions(cache_bytes=60 * 10**9)).runner_config
    assert isinstance(layout.cache_groups[1], State)
    assert layout.cache_groups[1].bytes_per_page == 30 * (32 * 128 * 128 * 4 + 8192 * 3 * 2)
    assert layout.page_bytes == 10 * 16 * 2 * 2 * 256 * 2  # 10 layers of K and V, 16 tokens

    assert_layout_hits_like_attention(layout)


def test_short_prefills_run_the_fixed_shape_body_with_split_state_rows(device: str) -> None:
    """A prefix hit's suffix (a prefill step of a few tokens a row) runs the fixed-shape body
    the decode graphs replay, its State rows split around the padding slots (a row's real
    tokens one State row, its padding another that reads zeros and writes nothing), with the
    State checkpoints a suffix that crosses a page boundary writes: the tokens equal the
    reference runner's and the varlen path's, over a third round that resumes from a
    checkpoint only a fixed-shape step wrote."""
    from dataclasses import replace

    from resin_models_cuda import RunnerOptions, load_runner
    from tests.cuda.test_deepseek_v4 import _fixed_shapes

    reference, fast = _runners(device, 16)
    folder = tiny(16)
    options = RunnerOptions(page_size=4, max_batch=4, max_context=64, num_pages=96)
    varlen = load_runner(folder, replace(options, graph_prefill_tokens=0), device, torch.float32)
    shapes = _fixed_shapes(fast)
    rng = np.random.default_rng(5)
    shared = rng.integers(0, 128, size=9).tolist()
    # round 1 caches the shared prefix (8 tokens resumable: two pages); round 2's suffixes
    # (1 to 7 tokens after the hit, two rows in one step) cross the page boundary at 12 or
    # not; round 3 extends a round-2 prompt past the checkpoint its suffix wrote
    first = [[*shared, 1, 2, 3]]
    second = [[*shared, 7], [*shared, 9, 4, 4, 8, 1, 6]]
    third = [[*second[1], 3, 3]]

    def run(runner: Any) -> tuple[list[list[int]], list[int]]:
        params = SamplingParams(max_output_tokens=3, temperature=0.0, ignore_stop_tokens=True)
        out, cached = [], []
        with Engine(runner, context_length=64, prefix_cache=True, prefill_chunk_tokens=64,
                    max_sequences=4) as engine:  # fmt: skip
            for prompts in (first, second, third):
                requests = [engine.submit(p, params) for p in prompts]
                while engine.has_work():
                    engine.step()
                    engine.check_invariants()
                out += [list(r.take_result()) for r in requests]
                cached += [r.cached_tokens for r in requests]
        return out, cached

    want, cached_ref = run(reference)
    shapes.clear()
    got, cached = run(fast)
    assert got == want and cached == cached_ref
    assert cached == [0, 8, 8, 12]  # round 3 resumed at the checkpoint round 2 wrote
    assert (2, 7) in shapes or (2, 9) in shapes, shapes  # round 2: two rows in one step
    assert any(q > 1 for rows, q in shapes if rows == 1), shapes  # round 3's suffix
    assert run(varlen)[0] == want
