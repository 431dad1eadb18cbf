"""The tiny DeepSeek-V4 checkpoint both runners' tests load (`test_deepseek_v4.py` explains its
shapes): a transformers model with its zero-initialised parameters randomised, saved as a
folder (cached per root)."""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

import torch
import transformers

HCA_RATIO = 16  # the published 128, shrunk so short prompts emit HCA entries

_CONFIG: dict[str, Any] = dict(
    vocab_size=300,
    hidden_size=64,
    moe_intermediate_size=32,
    num_hidden_layers=4,
    num_attention_heads=4,
    head_dim=32,
    q_lora_rank=32,
    qk_rope_head_dim=8,
    n_routed_experts=4,
    num_experts_per_tok=2,
    compress_ratios=[0, 0, 4, 128],  # the published spelling; 128 maps to HCA
    compress_rate_hca=HCA_RATIO,
    num_hash_layers=1,
    sliding_window=16,
    o_groups=2,
    o_lora_rank=16,
    index_n_heads=8,
    index_head_dim=16,
    index_topk=4,
    hc_mult=2,
    max_position_embeddings=1024,
    initializer_range=0.1,
    rope_parameters={"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 256,
                     "beta_fast": 32, "beta_slow": 1},
)  # fmt: skip


def randomized(config: dict[str, Any], seed: int) -> Any:
    """A transformers DeepSeek-V4 of `config` whose zero-initialised parameters (sinks, biases,
    norms, the hyper-connection bases) are random too, with a random token -> experts table."""
    torch.manual_seed(seed)
    model = transformers.DeepseekV4ForCausalLM(transformers.DeepseekV4Config(**config)).eval()
    experts, vocab = config["n_routed_experts"], config["vocab_size"]
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith(("position_bias", "sinks", ".base", "hc_base")) or "norm" in name:
                param.add_(torch.randn_like(param) * 0.1)
        for layer in model.model.layers:
            gate = layer.mlp.gate
            if hasattr(gate, "tid2eid"):  # a fixed token -> experts table
                k = config["num_experts_per_tok"]
                table = torch.stack([torch.randperm(experts)[:k] for _ in range(vocab)])
                gate.tid2eid.copy_(table)
            else:
                gate.e_score_correction_bias.add_(torch.randn(experts) * 0.1)
    return model


@functools.cache
def _checkpoint(root: Path) -> tuple[Path, Any]:
    model = randomized(_CONFIG, 0)
    folder = root / "tiny-deepseek-v4"
    model.save_pretrained(folder)
    return folder, model
