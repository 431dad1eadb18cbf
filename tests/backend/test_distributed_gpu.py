"""The 2-process equivalence tests on two CUDA GPUs (NCCL for the model, Gloo for plans), fp32:
the Engine over TP=2 / EP=2 gives the unsharded runner's greedy tokens and logits (1e-5)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from test_distributed import EQUIVALENCE_CASES, check_equivalence

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.timeout(300),
    pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 CUDA GPUs"),
]


@pytest.mark.parametrize("name", EQUIVALENCE_CASES)
def test_sharded_engine_equals_unsharded_on_two_gpus(name: str, tmp_path: Path) -> None:
    torch.backends.cuda.matmul.allow_tf32 = False  # fp32 means fp32 on both sides
    check_equivalence(name, tmp_path, "cuda")
