"""Penalties in the reference sampler against a plain numpy oracle, step after step (count
resets, then counts grown by the sampler's own tokens), the engine end to end against the
oracle over `transformers` logits, and tiny temperatures taken as greedy.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import numpy as np
import pytest
import torch
from ref_compare import hf_logits
from ref_hf import checkpoint

from resin import Engine, SamplingParams
from resin.engine.proposers import NgramProposer
from resin.engine.speculative import Speculation
from resin.plan import SamplingArrays
from resin.protocols import PENALTY_FEATURES
from resin_models_torch.registry import load_runner
from resin_models_torch.sampler import Sampler

V = 40


def oracle(
    logits: np.ndarray, prompt: list[int], generated: list[int], pen: tuple[float, float, float]
) -> np.ndarray:
    """OpenAI presence/frequency over generated tokens, vLLM repetition over both."""
    presence, frequency, repetition = pen
    counts = np.bincount(np.asarray(generated, dtype=np.int64), minlength=logits.size)
    seen = counts > 0
    seen[prompt] = True
    x = logits.astype(np.float64)
    x = np.where(seen, np.where(x > 0, x / repetition, x * repetition), x)
    return x - frequency * counts - presence * (counts > 0)


def arrays(
    pens: list[tuple[float, float, float] | None],
    resets: list[tuple[list[int], int] | None] | None = None,
    temperature: float = 0.0,
    seed: int = -1,
    output_index: int = 0,
) -> SamplingArrays:
    """Rows with `pens[i]` None have no penalties (no penalty arrays at all when no row has
    one); row i counts in slot 2 * i (slots need not be dense)."""
    b = len(pens)
    on = [p is not None for p in pens]
    values = np.array([p or (0.0, 0.0, 1.0) for p in pens], dtype=np.float32)
    extra: dict[str, np.ndarray] = {}
    if resets is not None:
        lens = [0 if r is None else len(r[0]) for r in resets]
        extra["count_reset_indptr"] = np.concatenate(([0], np.cumsum(lens))).astype(np.int32)
        ids = [t for r in resets if r is not None for t in r[0]]
        extra["count_reset_ids"] = np.array(ids, dtype=np.int32)
        extra["count_reset_prompt"] = np.array([0 if r is None else r[1] for r in resets], np.int32)
    if any(on):
        extra["presence_penalty"] = values[:, 0].copy()
        extra["frequency_penalty"] = values[:, 1].copy()
        extra["repetition_penalty"] = values[:, 2].copy()
        extra["count_slot"] = np.array([2 * i if o else -1 for i, o in enumerate(on)], np.int32)
    return SamplingArrays(
        temperature=np.full(b, temperature, np.float32),
        top_p=np.ones(b, np.float32),
        top_k=np.zeros(b, np.int32),
        min_p=np.zeros(b, np.float32),
        seed=np.full(b, seed, np.int64),
        output_index=np.full(b, output_index, np.int32),
        logprobs=np.full(b, 3, np.int32),
        **extra,
    )


PENS: list[tuple[float, float, float] | None] = [(0.5, 0.3, 1.3), None, (-0.4, 1.2, 0.7)]
PROMPTS = [[3, 4, 4, 9], [1, 2], [7, 30, 31]]
EARLIER = [[5, 5, 12], [], []]  # row 0 resumes after a recompute: generated tokens count too


def test_reference_penalties_match_the_oracle_step_after_step() -> None:
    gen = torch.Generator().manual_seed(0)
    sampler = Sampler(torch.device("cpu"))
    history = [list(e) for e in EARLIER]
    resets = [(PROMPTS[i] + EARLIER[i], len(PROMPTS[i])) if PENS[i] else None for i in range(3)]
    for step in range(6):
        # Logits that favour tokens already seen, so the penalties decide the argmax.
        logits = torch.randn(3, V, generator=gen) * 2
        for i in range(3):
            logits[i, PROMPTS[i] + history[i]] += 3.0
        params = arrays(PENS, resets if step == 0 else None)
        result = sampler.sample(logits, params, np.arange(3))
        for i in range(3):
            pen = PENS[i] or (0.0, 0.0, 1.0)
            want = oracle(logits[i].numpy(), PROMPTS[i], history[i], pen)
            lp = torch.log_softmax(torch.from_numpy(want), -1)
            assert int(result.token_ids[i]) == int(np.argmax(want)), (step, i)
            assert abs(float(result.logprobs[i]) - float(lp[int(np.argmax(want))])) < 1e-4
            assert result.top_ids is not None and result.top_logprobs is not None
            assert result.top_ids[i].tolist() == lp.topk(3).indices.tolist()
            history[i].append(int(result.token_ids[i]))


def test_a_prefill_reset_rebuilds_the_counts_from_scratch() -> None:
    """A retried or recomputed prefill sends the sequence again: counts never double."""
    sampler = Sampler(torch.device("cpu"))
    logits = torch.zeros(1, V)
    logits[0, 6] = 1.0  # generated twice before: with frequency 0.6 it falls below 0 ...
    pen = (0.0, 0.6, 1.0)
    reset = [([1, 2, 6, 6], 2)]
    for _ in range(3):  # ... however often the reset arrives
        sampler.sample(logits, arrays([pen], reset), np.arange(1))
        counts = sampler.counts.counts[0]
        assert int(counts[6]) == 2 and int(counts.sum()) == 3  # the two 6s + the sampled one


def test_sampled_rows_draw_from_the_penalized_distribution() -> None:
    """Seeded sampling of penalized logits equals seeded sampling of the oracle's logits."""
    logits = torch.randn(1, V, generator=torch.Generator().manual_seed(3))
    pen = (0.9, 0.5, 1.5)
    prompt, earlier = [1, 2, 3, 11], [11, 11, 20]
    want = torch.from_numpy(oracle(logits[0].numpy(), prompt, earlier, pen)).float()[None]
    for index in range(20):
        penalized = Sampler(torch.device("cpu")).sample(
            logits,
            arrays([pen], [(prompt + earlier, len(prompt))], 1.0, 9, index),
            np.arange(1),
        )
        plain = Sampler(torch.device("cpu")).sample(
            want, arrays([None], None, 1.0, 9, index), np.arange(1)
        )
        assert int(penalized.token_ids[0]) == int(plain.token_ids[0])


def test_a_tiny_positive_temperature_is_greedy() -> None:
    """1e-38 is a valid temperature; dividing by it overflowed into noise (often token 0)."""
    logits = torch.tensor([[5.0, -11.0, 13.0, 12.9, 0.0]]).repeat(8, 1)
    for t in (1e-38, 1e-30, 1e-6):
        params = arrays([None] * 8, None, t, -1)
        got = Sampler(torch.device("cpu")).sample(logits, params, np.arange(8)).token_ids
        assert got.tolist() == [2] * 8, t


SCENARIOS = {
    "chunked-prefix-overlap": dict(prefill_chunk_tokens=5, prefix_cache=True),
    "retract": dict(prefill_chunk_tokens=3, prefix_cache=True, num_pages=18),
    "speculative": dict(prefill_chunk_tokens=64, prefix_cache=False),
}


@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
def test_engine_with_penalties_equals_the_oracle_over_transformers(scenario: str) -> None:
    """Greedy continuations under penalties equal the argmax of the oracle applied to
    `transformers` logits, through chunked prefill, prefix hits, overlap, retraction (the
    counts are rebuilt on recompute) and speculation (penalized rows get no drafts)."""
    knobs = dict(SCENARIOS[scenario])
    folder, hf = checkpoint("llama3")
    runner = load_runner(folder, page_size=4, num_pages=knobs.pop("num_pages", None), overlap=False)
    gen = torch.Generator().manual_seed(11)
    shared = torch.randint(0, 300, (9,), generator=gen).tolist()
    prompts = [shared + torch.randint(0, 300, (n,), generator=gen).tolist() for n in (3, 6, 1)]
    prompts.append(prompts[0])  # a full prefix hit
    pens = [(0.8, 0.6, 1.4), (0.0, 0.0, 1.0), (-0.5, 1.5, 1.0), (0.0, 0.0, 2.0)]
    speculation = Speculation(NgramProposer(), 3) if scenario == "speculative" else None
    with Engine(
        runner, context_length=128, max_batch_tokens=64, speculation=speculation, **knobs
    ) as engine:
        requests = []
        for prompt, (p, f, r) in zip(prompts, pens, strict=True):
            params = SamplingParams(
                max_output_tokens=24,
                temperature=0.0,
                presence_penalty=p,
                frequency_penalty=f,
                repetition_penalty=r,
            )
            requests.append(engine.submit(prompt, params))
            engine.step()  # later requests arrive while earlier ones run
        while engine.has_work():
            engine.step()
        metrics = engine.metrics
    assert metrics is not None
    if "num_pages" in SCENARIOS[scenario]:
        assert metrics.num_preemptions > 0
    if speculation is not None:  # the request without penalties did speculate
        assert metrics.spec_decode_num_drafts > 0
    for request, prompt, pen in zip(requests, prompts, pens, strict=True):
        generated = request.take_result()
        ref = hf_logits(hf, prompt + generated)
        for j, token in enumerate(generated):
            want = oracle(ref[len(prompt) - 1 + j].numpy(), prompt, generated[:j], pen)
            assert token == int(np.argmax(want)), (scenario, pen, j)


def test_engine_refuses_penalties_a_runner_does_not_apply() -> None:
    folder, _ = checkpoint("llama3")
    runner = load_runner(folder)
    with Engine(runner) as engine:
        engine.submit([1, 2, 3], SamplingParams(presence_penalty=0.5))  # the reference applies
    plain = _NoPenalties(runner)
    with Engine(plain) as engine, pytest.raises(ValueError, match="frequency_penalty"):
        engine.submit([1, 2, 3], SamplingParams(frequency_penalty=0.5))


class _NoPenalties:
    """A runner that declares no penalty support (`RunnerConfig.features` without them)."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.runner_config = replace(
            inner.runner_config, features=inner.runner_config.features - PENALTY_FEATURES
        )

    def bind(self, layout: Any) -> None:
        self.inner.bind(layout)

    def forward(self, plan: Any) -> Any:
        return self.inner.forward(plan)


@pytest.mark.parametrize(
    "field, value",
    [
        ("presence_penalty", 2.5),
        ("frequency_penalty", -2.01),
        ("repetition_penalty", 0.0),
        ("repetition_penalty", float("inf")),
    ],
)
def test_penalty_ranges_are_checked(field: str, value: float) -> None:
    with pytest.raises(ValueError, match=field):
        SamplingParams(**{field: value})
