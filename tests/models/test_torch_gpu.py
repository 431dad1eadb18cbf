"""The reference runners on a CUDA device (skipped without one): fp32 logits match
`transformers` on the same device, and bf16 runs agree with fp32 on most greedy choices."""

from __future__ import annotations

import pytest
import torch
from ref_compare import max_logit_error
from ref_hf import ARCHS, checkpoint
from ref_planner import TinyPlanner

from resin_models_torch.registry import load_runner

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
]

PROMPTS = [[5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15], [3, 1, 4, 1, 5], [2]]


@pytest.mark.parametrize("arch", sorted(ARCHS))
def test_cuda_fp32_matches_transformers(arch: str) -> None:
    torch.backends.cuda.matmul.allow_tf32 = False
    folder, hf = checkpoint(arch)
    hf_cuda = hf.to("cuda")
    try:
        runner = load_runner(folder, device="cuda", dtype=torch.float32, page_size=4)
        runner.record_logits = True
        seqs = TinyPlanner(runner).run(PROMPTS, max_new=16, chunk=4)
        for seq in seqs:
            worst, _ = max_logit_error(runner.recorded, seq.sid, hf_cuda, seq.tokens[:-1])
            assert worst < 1e-3, f"{arch}: {worst}"
    finally:
        hf.to("cpu")


@pytest.mark.parametrize("arch", sorted(ARCHS))
def test_cuda_bf16_runs_and_mostly_agrees(arch: str) -> None:
    folder, _ = checkpoint(arch)
    fp32 = load_runner(folder, device="cuda", dtype=torch.float32)
    bf16 = load_runner(folder, device="cuda", dtype=torch.bfloat16)
    assert bf16.runner_config.page_bytes * 2 == fp32.runner_config.page_bytes
    params: dict[str, float | int] = {"logprobs": 2}
    a = TinyPlanner(fp32).run(PROMPTS, max_new=8, params=[params] * 3)
    b = TinyPlanner(bf16).run(PROMPTS, max_new=8, params=[params] * 3)
    first = [s.generated[0] for s in a], [s.generated[0] for s in b]
    assert sum(x == y for x, y in zip(*first, strict=True)) >= 2
    assert all(torch.isfinite(torch.tensor(s.logprobs)).all() for s in b)
