"""GPU sampler: greedy equals argmax, filters keep exactly the allowed tokens, seeded rows are
reproducible across batches, and sampled frequencies follow the softmax."""

from __future__ import annotations

import numpy as np
import torch

from resin_models_cuda.kernels.sampler import filter_thresholds, philox_seeds, sample_tokens


def _arrays(batch: int, device: str, **values: float) -> dict[str, torch.Tensor]:
    return {
        "temperature": torch.full((batch,), values.get("t", 1.0), device=device),
        "top_k": torch.full((batch,), int(values.get("k", 0)), dtype=torch.int32, device=device),
        "top_p": torch.full((batch,), values.get("p", 1.0), device=device),
        "min_p": torch.full((batch,), values.get("m", 0.0), device=device),
    }


def test_greedy_is_argmax(device: str) -> None:
    logits = torch.randn((5, 3001), device=device)
    seeds = torch.zeros(5, dtype=torch.int64, device=device)
    out = sample_tokens(logits, **_arrays(5, device, t=0.0), seeds=seeds, needs_filter=False)
    assert torch.equal(out, logits.argmax(-1))


def test_top_k_and_top_p_keep_only_allowed_tokens(device: str) -> None:
    logits = torch.randn((1, 50), device=device).repeat(64, 1)
    seeds = torch.arange(64, dtype=torch.int64, device=device)
    order = logits[0].argsort(descending=True)
    out = sample_tokens(logits, **_arrays(64, device, k=3), seeds=seeds, needs_filter=True)
    assert set(out.tolist()) <= set(order[:3].tolist())
    probs = torch.softmax(logits[0], -1)[order]
    nucleus = int((torch.cumsum(probs, 0) - probs < 0.5).sum())
    out = sample_tokens(logits, **_arrays(64, device, p=0.5), seeds=seeds, needs_filter=True)
    assert set(out.tolist()) <= set(order[:nucleus].tolist())


def test_thresholds_combine_filters() -> None:
    scaled = torch.tensor([[3.0, 2.0, 1.0, 0.0], [3.0, 2.0, 1.0, 0.0]])
    thresh = filter_thresholds(
        scaled, torch.tensor([2, 0], dtype=torch.int32), torch.tensor([1.0, 1.0]),
        torch.tensor([0.0, 0.3]),
    )  # fmt: skip
    # Row 0: top-2 keeps 3 and 2. Row 1: min-p 0.3 keeps p >= 0.3 * p_max: e^-1 = 0.37 passes.
    assert thresh.tolist() == [2.0, 2.0]


def test_seeded_rows_do_not_depend_on_the_batch(device: str) -> None:
    rng = np.random.default_rng(0)
    seed = np.array([7, 7, -1], dtype=np.int64)
    index = np.array([3, 3, 3], dtype=np.int32)
    seeds = philox_seeds(seed, index, rng)
    assert seeds[0] == seeds[1] and seeds[0] >= 0 and seeds[2] >= 0
    logits = torch.randn((1, 1000), device=device)
    alone = sample_tokens(
        logits, **_arrays(1, device), seeds=torch.tensor(seeds[:1]).to(device), needs_filter=False
    )
    mixed = torch.cat([torch.randn((2, 1000), device=device), logits])
    s = torch.tensor([seeds[2], 123, seeds[0]]).to(device)
    together = sample_tokens(mixed, **_arrays(3, device), seeds=s, needs_filter=False)
    assert together[2] == alone[0]


def test_frequencies_follow_softmax(device: str) -> None:
    rows = 4000 if device == "cuda" else 600
    base = torch.tensor([2.0, 1.0, 0.0, -1.0], device=device)
    logits = base.repeat(rows, 1)
    seeds = torch.tensor(philox_seeds(
        np.arange(rows, dtype=np.int64), np.zeros(rows, np.int32), np.random.default_rng(1)
    )).to(device)  # fmt: skip
    out = sample_tokens(logits, **_arrays(rows, device, t=0.7), seeds=seeds, needs_filter=False)
    freq = torch.bincount(out, minlength=4).float() / rows
    expect = torch.softmax(base / 0.7, -1)
    torch.testing.assert_close(freq, expect, atol=0.03 if device == "cuda" else 0.06, rtol=0)


def test_argmax_rows_takes_the_first_maximum(device: str) -> None:
    from resin_models_cuda.kernels.sampler import argmax_rows

    gen = torch.Generator().manual_seed(3)
    logits = torch.randn((5, 1000), generator=gen)
    logits[1, 17] = logits[1, 900] = 50.0  # a tie across chunks: the first wins
    logits[2, 5] = logits[2, 6] = 40.0  # a tie inside a chunk
    logits[3, 999] = 60.0  # the last id
    for block in (64, 256, 4096):
        got = argmax_rows(logits.to(device), block=block).cpu()
        assert got.dtype == torch.int32
        assert got.tolist() == logits.argmax(dim=-1).tolist()
    assert argmax_rows(logits[:0].to(device)).shape == (0,)
