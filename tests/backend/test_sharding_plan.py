"""What `shard_model` refuses, checked before any process group exists."""

from __future__ import annotations

import pytest
from cases import LLAMA, QWEN3_MOE

from resin_models_torch.parallel import ParallelStyle, check_shardable
from resin_models_torch.registry import random_runner


def test_shapes_that_do_not_split_are_refused() -> None:
    llama = random_runner(LLAMA).model  # 2 KV heads, intermediate 128
    check_shardable(llama, 2, ParallelStyle())
    with pytest.raises(ValueError, match="2 KV heads do not split over 4 ranks"):
        check_shardable(llama, 4, ParallelStyle())
    odd = random_runner({**LLAMA, "intermediate_size": 129}).model
    with pytest.raises(ValueError, match="intermediate_size 129"):
        check_shardable(odd, 2, ParallelStyle())


def test_expert_parallel_needs_no_even_expert_width() -> None:
    moe = random_runner({**QWEN3_MOE, "moe_intermediate_size": 33}).model
    with pytest.raises(ValueError, match="moe_intermediate_size 33"):
        check_shardable(moe, 2, ParallelStyle())
    check_shardable(moe, 2, ParallelStyle(experts="expert"))
    check_shardable(moe, 4, ParallelStyle(tensor=False, experts="expert"))  # 6 experts, uneven


def test_architectures_without_a_plan_are_refused() -> None:
    gemma = {
        **LLAMA,
        "model_type": "gemma3_text",
        "head_dim": 16,
        "sliding_window": 6,
        "layer_types": ["sliding_attention", "full_attention"],
        "query_pre_attn_scalar": 16,
    }
    with pytest.raises(ValueError, match="no parallel plan for model_type 'gemma3_text'"):
        check_shardable(random_runner(gemma).model, 2, ParallelStyle())
