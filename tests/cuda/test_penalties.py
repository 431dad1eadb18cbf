"""The fast runner's penalties against the reference: the kernel against `penalize` over odd
shapes and dtypes, `DeviceSampler.pick` against the reference `Sampler` step after step (count
resets, then counts grown on the device), and the Engine driving both runners on the same
weights to the same tokens. Tiny temperatures are greedy here too."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
import torch

from resin import Engine, SamplingParams
from resin.plan import SamplingArrays
from resin_model.penalties import TokenCounts, penalize
from resin_model.presets import TINY
from resin_models_cuda.kernels.penalties import apply_penalties
from resin_models_cuda.sampling import DeviceSampler
from resin_models_torch.sampler import Sampler
from tests.cuda.test_vs_reference import reference_and_fast


def _arrays(
    b: int,
    rng: np.random.Generator,
    vocab: int,
    reset: bool,
    temperature: float = 0.0,
) -> SamplingArrays:
    """Row 1 has no penalties; the others count in slots 3 * i (reset from random ids)."""
    slots = np.array([3 * i if i != 1 else -1 for i in range(b)], np.int32)
    extra: dict[str, np.ndarray] = {}
    if reset:
        lens = np.where(slots >= 0, rng.integers(1, 30, b), 0)
        extra["count_reset_indptr"] = np.concatenate(([0], np.cumsum(lens))).astype(np.int32)
        extra["count_reset_ids"] = rng.integers(0, vocab, int(lens.sum())).astype(np.int32)
        extra["count_reset_prompt"] = (lens // 2).astype(np.int32)
    return SamplingArrays(
        temperature=np.full(b, temperature, np.float32),
        top_p=np.ones(b, np.float32),
        top_k=np.zeros(b, np.int32),
        min_p=np.zeros(b, np.float32),
        seed=np.full(b, -1, np.int64),
        output_index=np.zeros(b, np.int32),
        logprobs=np.full(b, 2, np.int32),
        presence_penalty=rng.uniform(-2, 2, b).astype(np.float32),
        frequency_penalty=rng.uniform(-2, 2, b).astype(np.float32),
        repetition_penalty=rng.uniform(0.5, 2.0, b).astype(np.float32),
        count_slot=slots,
        **extra,
    )


@pytest.mark.parametrize(
    "vocab, dtype, atol", [(37, torch.float32, 1e-6), (3001, torch.float32, 1e-6),
                           (1030, torch.bfloat16, 1e-2)]
)  # fmt: skip
def test_kernel_matches_the_reference_rule(
    device: str, vocab: int, dtype: torch.dtype, atol: float
) -> None:
    rng = np.random.default_rng(vocab)
    params = _arrays(5, rng, vocab, reset=True)
    rows = np.arange(5)
    counts = TokenCounts(torch.device(device))
    logits = (torch.randn(5, vocab, device=device) * 4).to(dtype)
    want = penalize(logits, params, rows, counts)
    slots = counts.prepare(params, rows, vocab)
    got = apply_penalties(
        logits, slots, counts.counts, counts.prompt,
        *(torch.from_numpy(a.copy()).to(device) for a in (
            params.presence_penalty, params.frequency_penalty, params.repetition_penalty)),
    )  # fmt: skip
    assert int(counts.counts.sum()) > 0 and bool(counts.prompt.any())
    torch.testing.assert_close(got, want.float(), atol=atol, rtol=1e-5)
    assert torch.equal(got[1], logits[1].float())  # no penalties: unchanged


@pytest.mark.parametrize("temperature", [0.0, 1e-38])
def test_device_sampler_matches_the_reference_step_after_step(
    device: str, temperature: float
) -> None:
    """Greedy under penalties (and a tiny temperature, which is greedy): the same tokens and
    logprobs as the reference sampler over four steps, the counts kept on each device."""
    vocab, b = 501, 4
    fast = DeviceSampler(torch.device(device), seed=0)
    ref = Sampler(torch.device("cpu"))
    gen = torch.Generator().manual_seed(1)
    for step in range(4):
        params = _arrays(
            b, np.random.default_rng(7), vocab, reset=step == 0, temperature=temperature
        )
        logits = torch.randn(b, vocab, generator=gen) * 30  # large: 1e-38 would overflow
        want = ref.sample(logits, params, np.arange(b))
        plan = SimpleNamespace(sampling=params)
        tokens, lps = fast.pick(plan, np.arange(b), None, logits.to(device), None)  # type: ignore[arg-type]
        assert tokens.cpu().tolist() == want.token_ids.tolist(), step
        assert lps is not None
        torch.testing.assert_close(lps[0].cpu(), want.logprobs, atol=1e-4, rtol=1e-5)
    assert torch.equal(fast.counts.counts.cpu(), ref.counts.counts)


def _runners(device: str) -> tuple[Any, Any]:
    return reference_and_fast(TINY["llama"], device)


def test_engine_tokens_with_penalties_equal_the_reference(device: str) -> None:
    reference, fast = _runners(device)
    rng = np.random.default_rng(4)
    motif = rng.integers(0, 256, size=5).tolist()
    prompts = [motif * 3, rng.integers(0, 256, size=7).tolist(), motif * 2 + [3]]
    n = 8 if torch.cuda.is_available() else 5
    params = [
        SamplingParams(max_output_tokens=n, temperature=0.0, repetition_penalty=0.05,
                       ignore_stop_tokens=True),
        SamplingParams(max_output_tokens=n, temperature=0.0, ignore_stop_tokens=True),
        SamplingParams(max_output_tokens=n, temperature=1e-30, frequency_penalty=-2.0,
                       presence_penalty=1.5, repetition_penalty=0.1, ignore_stop_tokens=True),
    ]  # fmt: skip

    def run(runner: Any, params: list[SamplingParams]) -> list[list[int]]:
        with Engine(runner, context_length=100, prefill_chunk_tokens=8, max_batch_tokens=40,
                    max_sequences=8) as engine:  # fmt: skip
            requests = [engine.submit(p, s) for p, s in zip(prompts, params, strict=True)]
            while engine.has_work():
                engine.step()
        return [list(r.take_result()) for r in requests]

    want = run(reference, params)
    assert run(fast, params) == want
    plain = [SamplingParams(max_output_tokens=n, temperature=0.0, ignore_stop_tokens=True)] * 3
    assert run(_runners(device)[0], plain) != want  # the penalties did change the tokens
