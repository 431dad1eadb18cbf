"""The tiny models and engine settings the 2-process tests share (test and ranks alike)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import torch

from resin.backend.distributed import DEFAULT_CAPACITY
from resin_models_torch.parallel import ParallelStyle
from tests.server.doubles import ByteTokenizer

SEED = 3
DEVICE = os.environ.get("RESIN_TEST_DEVICE", "cpu")  # "cuda": rank r on cuda:r, NCCL
RUNNER_KWARGS: dict[str, Any] = {"page_size": 4, "num_pages": 96}
ENGINE_KWARGS: dict[str, Any] = {
    "context_length": 128,
    "prefix_cache": True,
    "prefill_chunk_tokens": 8,
    "max_batch_tokens": 16,
}

_COMMON: dict[str, Any] = {
    "vocab_size": 301,  # odd: the last vocab shard is shorter
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "num_hidden_layers": 2,
}
LLAMA: dict[str, Any] = {
    **_COMMON,
    "model_type": "llama",
    "rope_scaling": {
        "rope_type": "llama3",
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 32,
    },
}
QWEN2_TIED: dict[str, Any] = {**_COMMON, "model_type": "qwen2", "tie_word_embeddings": True}
QWEN3_MOE: dict[str, Any] = {
    **_COMMON,
    "model_type": "qwen3_moe",
    "head_dim": 16,
    "moe_intermediate_size": 32,
    "num_experts": 6,
    "num_experts_per_tok": 2,
    "norm_topk_prob": True,
    "mlp_only_layers": [1],
}


@dataclass(frozen=True)
class Case:
    config: dict[str, Any]
    style: ParallelStyle
    capacity: int = DEFAULT_CAPACITY  # plan channel buffer; small = every plan overflows


CASES: dict[str, Case] = {
    "llama-tp": Case(LLAMA, ParallelStyle(), capacity=128),
    "qwen2-tied-tp": Case(QWEN2_TIED, ParallelStyle()),
    "moe-tp": Case(QWEN3_MOE, ParallelStyle()),
    "moe-ep": Case(QWEN3_MOE, ParallelStyle(tensor=False, experts="expert")),
    "moe-tp-ep": Case(QWEN3_MOE, ParallelStyle(experts="expert")),
    "killed": Case(LLAMA, ParallelStyle()),
    "hung": Case(LLAMA, ParallelStyle()),
    "idle": Case(LLAMA, ParallelStyle()),
    "leader-crash": Case(LLAMA, ParallelStyle()),
    # The server's test tokenizer (UTF-8 bytes + ChatML specials) covers this vocabulary.
    "server": Case({**LLAMA, "vocab_size": ByteTokenizer.vocab_size}, ParallelStyle()),
}


def prompts() -> list[list[int]]:
    gen = torch.Generator().manual_seed(11)
    shared = torch.randint(0, 301, (9,), generator=gen).tolist()
    return [
        shared + torch.randint(0, 301, (5,), generator=gen).tolist(),
        torch.randint(0, 301, (3,), generator=gen).tolist(),
        [*shared, 300, 299],  # the top ids live in the last vocab shard
        [int(torch.randint(0, 301, (1,), generator=gen))],
    ]
