"""Every architecture, tiny random weights, fp32 CPU: Resin's runner (driven by a private test
planner with chunked prefill and mixed prompt lengths) matches `transformers` within 1e-4 on
the logits of every position, and its greedy 32-token continuations equal `generate`."""

from __future__ import annotations

import pytest
import torch
from ref_compare import hf_greedy, max_logit_error
from ref_hf import ARCHS, checkpoint
from ref_planner import TinyPlanner

from resin_models_torch.registry import load_runner

PROMPT_LENS = (11, 3, 1, 17)


def _prompts(seed: int) -> list[list[int]]:
    gen = torch.Generator().manual_seed(seed)
    return [torch.randint(0, 300, (n,), generator=gen).tolist() for n in PROMPT_LENS]


@pytest.mark.parametrize("arch", sorted(ARCHS))
@pytest.mark.parametrize(("chunk", "page_size"), [(1 << 20, 16), (4, 4)])
def test_logits_and_greedy_match_transformers(arch: str, chunk: int, page_size: int) -> None:
    folder, hf = checkpoint(arch)
    runner = load_runner(folder, page_size=page_size)
    runner.record_logits = True
    prompts = _prompts(len(arch))
    seqs = TinyPlanner(runner).run(prompts, max_new=32, chunk=chunk)
    for seq, prompt in zip(seqs, prompts, strict=True):
        worst, count = max_logit_error(runner.recorded, seq.sid, hf, seq.tokens[:-1])
        assert count == len(seq.tokens) - 1
        assert worst < 1e-4, f"{arch}: logits differ by {worst}"
        assert seq.generated == hf_greedy(hf, prompt, 32)
