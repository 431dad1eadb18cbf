"""CudaRunner end to end against transformers on the same weights (tiny configs on CPU through
the Triton interpreter, float32; a bf16 8B-shaped check on the GPU), plus the CPU-testable
parts: plan-to-buffer staging, graph buckets, config translation."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
import torch

from resin.plan import Phase
from resin_models_cuda.config import PRESETS, ModelConfig, preset
from resin_models_cuda.graphs import buckets_up_to, pick_bucket


def _validate(config: ModelConfig, device: str, dtype: torch.dtype, **kw: object) -> list:
    from resin_models_cuda import RunnerOptions, random_weights
    from resin_models_cuda.validate import validate

    weights = random_weights(config, device, dtype, seed=0, std=0.2, embed_std=5)
    options = RunnerOptions(page_size=4, max_batch=8, max_context=128)
    return validate(config, weights, options, **kw)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "config",
    [preset("tiny"), replace(preset("tiny"), model_type="mistral", sliding_window=9),
     replace(preset("tiny"), model_type="qwen3", qk_norm=True, tie_word_embeddings=True)],
    ids=["llama", "mistral-window", "qwen3"],
)  # fmt: skip
def test_runner_matches_transformers_cpu(config: ModelConfig) -> None:
    pytest.importorskip("transformers")
    if torch.cuda.is_available():
        pytest.skip("float32 through the interpreter: CPU only (GPU tests cover fp32 and bf16)")
    results = _validate(
        config, "cpu", torch.float32, num_prompts=4, new_tokens=5, prompt_lens=(5, 26), chunk=7
    )
    for r in results:
        assert r.agree == r.prompts, r
        assert r.logit_max_abs_diff < 1e-4 * max(1.0, r.logit_ref_max_abs), r


@pytest.mark.gpu
def test_runner_matches_transformers_gpu_fp32() -> None:
    """Float32 on both sides: greedy continuations agree on >= 95% of 64 prompts."""
    from resin_models_cuda import RunnerOptions, random_weights
    from resin_models_cuda.validate import validate

    config = replace(preset("llama-8b"), num_layers=4)
    weights = random_weights(config, "cuda", torch.float32, seed=0)
    results = validate(config, weights, RunnerOptions(max_batch=48, max_context=1024),
                       num_prompts=64, new_tokens=32)  # fmt: skip
    for r in results:
        assert r.agree_fraction >= 0.95, r
        assert r.logit_max_abs_diff <= 1e-3 * r.logit_ref_max_abs, r


@pytest.mark.gpu
def test_runner_bf16_error_is_transformers_bf16_error() -> None:
    """bf16: against a float32 oracle, the runner errs no more than transformers in bf16."""
    from resin_models_cuda import RunnerOptions, random_weights
    from resin_models_cuda.validate import validate

    config = replace(preset("llama-8b"), num_layers=4)
    weights = random_weights(config, "cuda", torch.bfloat16, seed=0, residual_scale=True,
                             embed_std=50)  # fmt: skip
    results = validate(config, weights, RunnerOptions(max_batch=48, max_context=1024),
                       num_prompts=64, new_tokens=32)  # fmt: skip
    for r in results:
        assert r.logit_mean_abs_diff <= 1.25 * r.baseline_logit_mean_abs_diff, r
        assert r.position_agreement >= r.baseline_position_agreement - 0.02, r


def test_decode_buffers_stage_plan_and_padding() -> None:
    from resin_models_cuda.buffers import DecodeBuffers
    from resin_models_cuda.plans import PagedPlanner

    planner = PagedPlanner(num_pages=32, page_size=4)
    seqs = [planner.new_sequence(list(range(n))) for n in (5, 9)]
    for s in seqs:
        s.cached = len(s.tokens) - 1
    plan = planner.plan([(s, 1) for s in seqs], Phase.DECODE)
    buffers = DecodeBuffers(max_rows=4, max_page_ids=16, device="cpu")
    buffers.stage_padding(4)
    buffers.stage(plan, group=0, rows=4)
    v = buffers.views(4)
    assert v.input_ids.tolist() == [4, 8, 0, 0]
    assert v.positions.tolist() == [4, 8, 0, 0]
    assert v.seq_lens.tolist() == [5, 9, 0, 0]
    g = plan.cache_groups[0]
    assert v.slots.tolist() == [*g.append_slots.tolist(), -1, -1]
    assert v.page_indptr.tolist() == [0, 2, 5, 5, 5]
    assert v.page_ids[:5].tolist() == g.page_ids.tolist()
    with pytest.raises(ValueError, match="do not fit"):
        buffers.stage(plan, group=0, rows=1)


def test_graph_buckets() -> None:
    assert buckets_up_to(1) == (1,)
    assert buckets_up_to(50) == (1, 2, 4, 8, 16, 24, 32, 40, 48, 50)
    buckets = buckets_up_to(256)
    assert pick_bucket(3, buckets) == 4
    assert pick_bucket(64, buckets) == 64
    assert pick_bucket(65, buckets) == 80
    assert pick_bucket(257, buckets) is None
    with pytest.raises(ValueError):
        buckets_up_to(0)


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_config_round_trips_through_hf_dict(name: str) -> None:
    config = PRESETS[name]
    assert ModelConfig.from_hf(config.to_hf()) == config


def test_config_rejects_unknown_model_type() -> None:
    with pytest.raises(ValueError, match="unsupported"):
        ModelConfig.from_hf({"model_type": "gpt2", "hidden_size": 8})


def test_runner_rejects_context_beyond_its_tables(device: str) -> None:
    from resin.protocols import CacheLayout
    from resin_models_cuda import CudaRunner, RunnerOptions, random_weights
    from resin_models_cuda.plans import PagedPlanner

    config = preset("tiny")
    runner = CudaRunner(config, random_weights(config, device, torch.float32),
                        RunnerOptions(page_size=4, max_batch=2, max_context=16))  # fmt: skip
    rc = runner.runner_config
    runner.bind(CacheLayout(16, 4, rc.page_bytes, rc.cache_groups))
    planner = PagedPlanner(16, 4)
    seq = planner.new_sequence(np.arange(20).tolist())
    with pytest.raises(ValueError, match="max_context"):
        runner.forward(planner.plan([(seq, 20)], Phase.PREFILL))
