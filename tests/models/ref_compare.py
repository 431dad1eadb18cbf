"""Comparisons against `transformers`: per-position logits and greedy generation."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from resin import Engine, SamplingParams, TokensEvent
from resin_models_torch.runner import RecordedStep


def hf_logits(hf_model: Any, tokens: list[int]) -> torch.Tensor:
    """Full-sequence logits [len(tokens), V] in one causal forward."""
    device = next(hf_model.parameters()).device
    with torch.no_grad():
        return hf_model(torch.tensor([tokens], device=device)).logits[0].float().cpu()  # type: ignore[no-any-return]


def hf_greedy(hf_model: Any, prompt: list[int], new_tokens: int) -> list[int]:
    """`transformers.generate` greedy continuation (no EOS, exactly `new_tokens`)."""
    with torch.no_grad():
        out = hf_model.generate(
            torch.tensor([prompt]),
            attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
            max_new_tokens=new_tokens,
            min_new_tokens=new_tokens,
            do_sample=False,
            eos_token_id=None,
            pad_token_id=0,
        )
    return [int(t) for t in out[0, len(prompt) :]]


def max_logit_error(
    recorded: list[RecordedStep], sequence_id: int, hf_model: Any, tokens: list[int]
) -> tuple[float, int]:
    """Largest |resin - hf| over every position the runner computed for `sequence_id`,
    and how many positions were compared (a recomputed position is compared each time)."""
    ref = hf_logits(hf_model, tokens)
    worst, count = 0.0, 0
    for step in recorded:
        mask = step.sequence_ids == sequence_id
        if not mask.any():
            continue
        positions = step.positions[mask].astype(np.int64)
        assert step.logits is not None
        diff = (step.logits[torch.from_numpy(mask)] - ref[torch.from_numpy(positions)]).abs()
        worst, count = max(worst, float(diff.max())), count + int(mask.sum())
    return worst, count


def drain(engine: Engine) -> list[TokensEvent]:
    events = []
    while engine.has_work():
        events += [e for e in engine.step() if isinstance(e, TokensEvent)]
    return events


def shared_prefix_hit_ratio(runner: Any) -> float:
    """Prefix-hit ratio of 64 requests sharing a 1,024-token prefix (the first one cached
    before the others arrive): the held-out check hybrid models run against pure attention."""
    gen = torch.Generator().manual_seed(0)
    prefix = torch.randint(0, 300, (1024,), generator=gen).tolist()
    prompts = [prefix + torch.randint(0, 300, (32,), generator=gen).tolist() for _ in range(64)]
    params = SamplingParams(max_output_tokens=1, temperature=0.0)
    with Engine(runner, context_length=2048, prefix_cache=True,
                max_batch_tokens=2048) as engine:  # fmt: skip
        first = engine.submit(prompts[0], params)
        while not first.output_token_ids:
            engine.step()
        for prompt in prompts[1:]:
            engine.submit(prompt, params)
        drain(engine)
        metrics = engine.metrics
    assert metrics is not None and metrics.prefix_cache_queries == 64 * 1056
    return metrics.prefix_cache_hits / metrics.prefix_cache_queries
