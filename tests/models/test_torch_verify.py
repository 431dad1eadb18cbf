"""Speculative verification (`resin_models_torch.verify`): greedy longest-prefix + correction,
the rejection rule's distribution, seeded rows equal to non-speculative sampling, logprobs,
filters, and the bench-only forced acceptance."""

from __future__ import annotations

import numpy as np
import torch

from resin.plan import BatchPlan, Phase, SamplingArrays
from resin_models_torch.sampler import Sampler
from resin_models_torch.verify import draft_layout, verify

V = 8


def chi_square_p(observed: np.ndarray, expected: np.ndarray) -> float:
    """Pearson chi-square goodness-of-fit p-value (cells with expected mass only)."""
    cells = expected > 0
    statistic = float((((observed - expected) ** 2)[cells] / expected[cells]).sum())
    dof = int(cells.sum()) - 1
    return float(torch.special.gammaincc(torch.tensor(dof / 2), torch.tensor(statistic / 2)))


def _plan(inputs: list[list[int]], drafts: list[int], **values: float | int) -> BatchPlan:
    """A decode plan: row i's query tokens are `inputs[i]` (its input then `drafts[i]` drafts)."""
    b = len(inputs)

    def col(name: str, default: float | int, dtype: type) -> np.ndarray:
        return np.full(b, values.get(name, default), dtype=dtype)

    sampling = SamplingArrays(
        temperature=col("temperature", 0.0, np.float32),
        top_p=col("top_p", 1.0, np.float32),
        top_k=col("top_k", 0, np.int32),
        min_p=col("min_p", 0.0, np.float32),
        seed=col("seed", -1, np.int64),
        output_index=col("output_index", 3, np.int32),
        logprobs=col("logprobs", -1, np.int32),
    )
    lens = np.array([len(x) for x in inputs])
    indptr = np.concatenate(([0], np.cumsum(lens))).astype(np.int32)
    flat = np.concatenate([np.array(x) for x in inputs]).astype(np.int32)
    draft_ids = np.concatenate([np.array(x[1:], dtype=np.int32) for x in inputs])
    draft_indptr = np.concatenate(([0], np.cumsum(lens - 1))).astype(np.int32)
    assert list(lens - 1) == drafts
    ctx = np.full(b, 10, dtype=np.int32)
    return BatchPlan(
        step_id=0,
        phase=Phase.DECODE,
        sequence_ids=np.arange(b, dtype=np.int64),
        input_ids=flat,
        query_indptr=indptr,
        positions=np.concatenate([np.arange(10, 10 + n) for n in lens]).astype(np.int32),
        cached_lens=ctx,
        total_lens=(ctx + lens).astype(np.int32),
        sample_rows=np.ones(b, dtype=bool),
        sampling=sampling,
        cache_groups=(),
        prompt_logprob_rows=np.zeros(b, dtype=bool),
        target_ids=np.full(len(flat), -1, dtype=np.int32),
        draft_indptr=draft_indptr,
        draft_ids=draft_ids,
    )


def _run(plan: BatchPlan, logits: torch.Tensor, accept_first: int | None = None):  # type: ignore[no-untyped-def]
    layout = draft_layout(plan)
    result = verify(logits[layout.token_index], plan, layout, Sampler(torch.device("cpu"), 5),
                    accept_first)  # fmt: skip
    return result.to_output(plan, layout)


def _rows(out) -> list[list[int]]:  # type: ignore[no-untyped-def]
    ind = out.token_indptr
    return [out.token_ids[ind[i] : ind[i + 1]].tolist() for i in range(len(ind) - 1)]


def _peaked(argmaxes: list[int]) -> torch.Tensor:
    logits = torch.zeros(len(argmaxes), V)
    logits[torch.arange(len(argmaxes)), torch.tensor(argmaxes)] = 5.0
    return logits


def test_greedy_accepts_the_matching_prefix_then_the_correction_or_bonus() -> None:
    # Row 0: drafts 4 5 6; the model says 4 5 7 -> accept 4 5, correct to 7.
    # Row 1: no drafts -> its argmax. Row 2: drafts 1 2 all match -> 1 2 + bonus 3.
    # Row 3: first draft wrong -> only the correction.
    plan = _plan([[9, 4, 5, 6], [0], [7, 1, 2], [3, 6]], [3, 0, 2, 1])
    logits = _peaked([4, 5, 7, 0, 2, 1, 2, 3, 1, 6])
    assert _rows(_run(plan, logits)) == [[4, 5, 7], [2], [1, 2, 3], [1]]


def test_seeded_rows_return_exactly_what_non_speculative_sampling_draws() -> None:
    torch.manual_seed(0)
    logits = torch.randn(4, V)
    sampler = Sampler(torch.device("cpu"))
    plain = [
        int(
            sampler.sample(
                logits[j : j + 1],
                _plan([[1]], [0], seed=11, output_index=3 + j, temperature=1.0).sampling,
                np.zeros(1, dtype=np.int64),
            ).token_ids[0]
        )
        for j in range(4)
    ]
    # Drafts equal to the plain samples are all accepted, and the bonus is the plain 4th draw.
    plan = _plan([[1, *plain[:3]]], [3], seed=11, temperature=1.0)
    assert _rows(_run(plan, logits)) == [plain]
    # A wrong second draft: the first is accepted, then the plain draw of position 4.
    wrong = (plain[1] + 1) % V
    plan = _plan([[1, plain[0], wrong, 0]], [3], seed=11, temperature=1.0)
    assert _rows(_run(plan, logits)) == [plain[:2]]


def test_rejection_rule_matches_the_target_distribution() -> None:
    """20k rows, one draft each: the first token follows p, the draft is accepted with
    probability p(d), and the token after a rejection follows p without d."""
    n, draft = 20_000, 1
    logits_row = torch.tensor([1.0, 0.6, 0.2, -0.3, -1.0, 0.0, 0.4, -2.0])
    p = torch.softmax(logits_row, -1).numpy()
    plan = _plan([[0, draft]] * n, [1] * n, temperature=1.0)
    second = torch.tensor([0.3, -0.5, 1.2, 0.0, 0.1, -1.0, 0.7, 0.2])
    logits = torch.stack([logits_row, second]).repeat(n, 1)
    rows = _rows(_run(plan, logits))
    first = np.array([r[0] for r in rows])
    observed = np.bincount(first, minlength=V)
    assert chi_square_p(observed, p * n) > 0.01
    assert chi_square_p(observed, np.full(V, n / V)) < 1e-6  # the test can tell a wrong p
    accepted = np.array([len(r) == 2 for r in rows])
    assert np.array_equal(accepted, first == draft)
    q = torch.softmax(second, -1).numpy()  # the bonus follows the next position's p
    bonus = np.bincount([r[1] for r in rows if len(r) == 2], minlength=V)
    assert chi_square_p(bonus, q * bonus.sum()) > 0.01


def test_filters_apply_to_every_verified_position() -> None:
    logits = torch.tensor([[3.0, 2.0, 1.0, 0, 0, 0, 0, 0]]).repeat(2 * 500, 1)
    plan = _plan([[0, 2]] * 500, [1] * 500, temperature=1.0, top_k=2)
    rows = _rows(_run(plan, logits))
    assert {t for r in rows for t in r} <= {0, 1}  # draft 2 lies outside top-k: never accepted
    assert all(len(r) == 1 for r in rows)


def test_logprobs_and_top_alternatives_for_every_returned_token() -> None:
    torch.manual_seed(1)
    logits = torch.randn(3, V)
    greedy = logits.argmax(-1).tolist()
    plan = _plan([[0, greedy[0], greedy[1]]], [2], logprobs=2)
    out = _run(plan, logits)
    assert _rows(out) == [greedy]
    reference = torch.log_softmax(logits, -1)
    assert out.logprobs is not None and out.top_ids is not None
    expected = reference.gather(1, torch.tensor(greedy)[:, None])[:, 0].numpy()
    np.testing.assert_allclose(out.logprobs, expected, rtol=1e-6)
    assert np.array_equal(out.top_ids, reference.topk(2, -1).indices.numpy())


def test_forced_acceptance_is_bench_only_and_takes_the_first_k_drafts() -> None:
    plan = _plan([[0, 6, 6, 6], [0, 5]], [3, 1])
    logits = _peaked([1, 1, 1, 1, 2, 2])
    assert _rows(_run(plan, logits)) == [[1], [2]]
    assert _rows(_run(plan, logits, accept_first=2)) == [[6, 6, 1], [5, 2]]
