"""MTP drafts through the Engine's speculative decoding are exact: a tiny random DeepSeek V3
model with one (random) MTP layer gives identical tokens with and without MTP drafts, greedy
and seeded sampling, under chunked prefill and prefix hits. The vocabulary is small (16) so
that random drafts are accepted often enough to exercise both the accept and reject paths."""

from __future__ import annotations

from typing import Any

import torch

from resin import Engine, SamplingParams
from resin.engine.proposers import MtpProposer
from resin.engine.speculative import Speculation
from resin_models_torch.mtp import MtpRunner
from resin_models_torch.registry import random_runner
from resin_models_torch.runner import TorchRunner

VOCAB = 16

CONFIG: dict[str, Any] = {
    "model_type": "deepseek_v3",
    "vocab_size": VOCAB,
    "hidden_size": 64,
    "intermediate_size": 96,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "rms_norm_eps": 1e-6,
    "kv_lora_rank": 32,
    "q_lora_rank": 24,
    "qk_rope_head_dim": 8,
    "qk_nope_head_dim": 16,
    "v_head_dim": 16,
    "n_routed_experts": 8,
    "num_experts_per_tok": 2,
    "n_group": 4,
    "topk_group": 2,
    "moe_intermediate_size": 32,
    "first_k_dense_replace": 1,
    "num_nextn_predict_layers": 1,
}


def _prompts() -> list[list[int]]:
    gen = torch.Generator().manual_seed(4)
    shared = torch.randint(0, VOCAB, (11,), generator=gen).tolist()
    return [
        [*shared, 3, 1],
        torch.randint(0, VOCAB, (7,), generator=gen).tolist(),
        [*shared, 9],  # a prefix hit on the first prompt's pages
        [5],
        [*shared, 3, 1],  # an exact repeat
    ]


def _params(i: int) -> SamplingParams:
    if i % 2:
        return SamplingParams(max_output_tokens=24, temperature=0.8, top_p=0.9, seed=100 + i)
    return SamplingParams(max_output_tokens=24, temperature=0.0)


def _generate(runner: TorchRunner, speculation: Speculation | None) -> tuple[list[list[int]], Any]:
    with Engine(
        runner,
        context_length=128,
        prefix_cache=True,
        prefill_chunk_tokens=5,
        max_batch_tokens=16,
        speculation=speculation,
    ) as engine:
        prompts = _prompts()
        requests = [engine.submit(prompts[0], _params(0))]
        engine.step()  # the others arrive while the first runs
        requests += [engine.submit(p, _params(i + 1)) for i, p in enumerate(prompts[1:])]
        while engine.has_work():
            engine.step()
        metrics = engine.metrics
    return [r.take_result() for r in requests], metrics


def test_outputs_identical_with_and_without_mtp_drafts() -> None:
    plain = random_runner(CONFIG, seed=2, page_size=4, overlap=False)  # steps land in order
    expected, base = _generate(plain, None)
    assert base.prefix_cache_hits > 0
    for drafts in (1, 3):  # one MTP draft per step, and the layer chained for three
        mtp = MtpRunner(plain.model, num_drafts=drafts, page_size=4)  # type: ignore[arg-type]
        got, metrics = _generate(mtp, Speculation(MtpProposer(), num_draft_tokens=drafts))
        assert got == expected
        assert metrics.prefix_cache_hits > 0
        # Drafts really ran through verification, some accepted and some rejected.
        assert metrics.spec_decode_num_drafts > 20
        assert metrics.spec_decode_num_draft_tokens > (drafts - 1) * metrics.spec_decode_num_drafts
        assert 0 < metrics.spec_decode_num_accepted_tokens < metrics.spec_decode_num_draft_tokens
