"""Comparisons against `transformers`: per-position logits and greedy generation."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

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
