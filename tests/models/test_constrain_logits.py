"""The plan's token bitmask and logit biases on the logits (`resin_model.constraints`,
plain torch that the reference sampler and `CudaRunner` both call, run here on CPU), then
through the reference sampler: masked tokens are never drawn, greedy and logprobs see the
processed distribution."""

from __future__ import annotations

import dataclasses

import numpy as np
import torch

from resin.plan import SamplingArrays
from resin_model.constraints import constrain_logits
from resin_models_torch.sampler import Sampler

VOCAB = 70  # three mask words, the last one partial


def _arrays(n: int, **extra: object) -> SamplingArrays:
    base = SamplingArrays(
        temperature=np.ones(n, dtype=np.float32),
        top_p=np.ones(n, dtype=np.float32),
        top_k=np.zeros(n, dtype=np.int32),
        min_p=np.zeros(n, dtype=np.float32),
        seed=np.full(n, -1, dtype=np.int64),
        output_index=np.zeros(n, dtype=np.int32),
        logprobs=np.zeros(n, dtype=np.int32),
    )
    return dataclasses.replace(base, **extra)  # type: ignore[arg-type]


def _mask(rows: list[list[int] | None]) -> np.ndarray:
    words = -(-VOCAB // 32)
    out = np.full((len(rows), words), -1, dtype=np.int32)
    for i, allowed in enumerate(rows):
        if allowed is None:
            continue
        bits = np.zeros(words * 32, dtype=np.uint8)
        bits[allowed] = 1
        out[i] = np.packbits(bits, bitorder="little").view(np.int32)
    return out


def test_mask_and_bias_match_a_plain_loop() -> None:
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(4, VOCAB, generator=gen)
    allowed = [[0, 31, 32, 63, 64, 69], None, [5], None]
    params = _arrays(
        4,
        token_bitmask=_mask(allowed),
        bias_indptr=np.array([0, 2, 2, 3, 4], dtype=np.int32),
        bias_ids=np.array([31, 69, 5, 2], dtype=np.int32),
        bias_values=np.array([1.5, -2.0, 100.0, -100.0], dtype=np.float32),
    )
    rows = np.array([3, 0, 2])  # the logits belong to plan rows 3, 0, 2 (row 1 samples none)
    out = constrain_logits(logits[:3], params, rows)
    expected = logits[:3].clone()
    for j, row in enumerate(rows):
        for k in range(params.bias_indptr[row], params.bias_indptr[row + 1]):
            expected[j, params.bias_ids[k]] += float(params.bias_values[k])
        if allowed[row] is not None:
            keep = torch.zeros(VOCAB, dtype=torch.bool)
            keep[allowed[row]] = True
            expected[j, ~keep] = float("-inf")
    assert torch.equal(out, expected)
    assert not torch.equal(out, logits[:3])  # a new tensor; the input is untouched
    plain = logits[:2]
    assert constrain_logits(plain, _arrays(2), np.arange(2)) is plain


def test_sampler_never_draws_a_masked_token_and_reports_masked_logprobs() -> None:
    logits = torch.zeros(200, VOCAB)
    logits[:, 0] = 10.0  # the model's favourite is forbidden
    allowed = [3, 40, 69]
    params = _arrays(200, token_bitmask=_mask([allowed] * 200))
    result = Sampler(torch.device("cpu"), seed=2).sample(logits, params, np.arange(200))
    drawn = set(result.token_ids.tolist())
    assert drawn == set(allowed)  # uniform over the three: all appear in 200 draws
    assert torch.allclose(result.logprobs, torch.full((200,), float(np.log(1 / 3))))
    greedy = _arrays(
        1,
        temperature=np.zeros(1, dtype=np.float32),
        token_bitmask=_mask([allowed]),
        logprobs=np.full(1, 2, dtype=np.int32),
    )
    one = Sampler(torch.device("cpu")).sample(logits[:1], greedy, np.arange(1))
    assert int(one.token_ids[0]) in allowed
    assert one.top_ids is not None and set(one.top_ids[0].tolist()) <= set(allowed)


def test_sampler_without_constraints_is_unchanged() -> None:
    logits = torch.randn(3, VOCAB, generator=torch.Generator().manual_seed(1))
    params = _arrays(3, temperature=np.zeros(3, dtype=np.float32))
    assert constrain_logits(logits, params, np.arange(3)) is logits
    result = Sampler(torch.device("cpu")).sample(logits, params, np.arange(3))
    assert torch.equal(result.token_ids, logits.argmax(-1))
    assert torch.allclose(result.logprobs, torch.log_softmax(logits, -1).max(-1).values)
