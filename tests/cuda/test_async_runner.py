"""CudaRunner as an AsyncRunner with overlap, and speculative verification.

- Pipelined `submit`/`collect` with two plans in flight, the second plan's input tokens named
  by `prev_token_rows` (resolved on the device), gives exactly the tokens of synchronous
  `forward` steps: greedy and seeded sampling, with and without CUDA graphs.
- A verify step (rows with 1 + k query tokens) returns the accepted draft prefix + one token,
  the same tokens as plain decode steps: all drafts right, a wrong draft in the middle,
  rows with different k, seeded sampling.
- A plan whose mask is still being filled (`mask_pending`) is sampled only at the next
  `submit` or its `collect`, never before its mask is ready, with the tokens of a
  synchronous run that had the mask up front.
- Misuse gets a clear error.
On CPU the kernels run in the Triton interpreter; on a GPU the same tests run compiled."""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import torch

from resin.plan import BatchPlan, Phase
from resin.protocols import CacheLayout
from resin_app.bench.plans import PagedPlanner, Sampling, Sequence
from resin_model.presets import TINY
from tests.cuda.test_vs_reference import reference_and_fast

PROMPTS = [[5, 9, 13, 200, 7], [1, 2, 3], [40, 41, 42, 43, 44, 45, 46, 47, 48]]
SEEDED = Sampling(temperature=0.8, top_p=0.9, seed=1234)


def _runner(device: str, arch: str = "llama", graphs: bool = True, **kw: Any) -> Any:
    from resin_models_cuda import CudaRunner

    _, fast = reference_and_fast(TINY[arch], device)
    options = dataclasses.replace(fast.options, cuda_graphs=graphs, **kw)
    runner = CudaRunner(fast.model, options)
    cfg = runner.runner_config
    runner.bind(CacheLayout(160, 4, cfg.page_bytes, cfg.cache_groups))
    return runner


def _prefill(runner: Any, planner: PagedPlanner, sampling: list[Sampling]) -> list[Sequence]:
    seqs = [planner.new_sequence(list(p)) for p in PROMPTS]
    rows = [(s, len(s.tokens)) for s in seqs]
    out = runner.forward(planner.plan(rows, Phase.PREFILL, sampling))
    planner.commit(rows)
    for s, t in zip(seqs, out.token_ids.tolist(), strict=True):
        s.tokens.append(int(t))
    return seqs


def _decode_plan(
    planner: PagedPlanner, seqs: list[Sequence], sampling: list[Sampling], order: list[int]
) -> BatchPlan:
    rows = [(seqs[i], 1) for i in order]
    out_index = [len(seqs[i].tokens) - len(PROMPTS[i]) for i in order]
    plan = planner.plan(rows, Phase.DECODE, [sampling[i] for i in order], out_index)
    planner.commit(rows)
    return plan


Decorate = Callable[[BatchPlan], BatchPlan]


def _sync_run(
    runner: Any, sampling: list[Sampling], steps: int, decorate: Decorate = lambda p: p
) -> list[list[int]]:
    planner = PagedPlanner(160, 4)
    seqs = _prefill(runner, planner, sampling)
    for _ in range(steps):
        out = runner.forward(decorate(_decode_plan(planner, seqs, sampling, [0, 1, 2])))
        for s, t in zip(seqs, out.token_ids.tolist(), strict=True):
            s.tokens.append(int(t))
    return [s.tokens for s in seqs]


def _overlapped_run(
    runner: Any,
    sampling: list[Sampling],
    steps: int,
    decorate: Decorate = lambda p: p,
    landed: Callable[[], None] = lambda: None,
) -> list[list[int]]:
    """Step n+1 is submitted before step n is collected; its inputs come from the device.
    The rows change order every step (prev_token_rows maps them). `landed` runs after each
    collect (where the engine advances grammars and opens the next plan's mask)."""
    planner = PagedPlanner(160, 4)
    seqs = _prefill(runner, planner, sampling)
    orders = [[0, 1, 2], [2, 0, 1]]
    runner.submit(decorate(_decode_plan(planner, seqs, sampling, orders[0])))
    for step in range(steps):
        order = orders[step % 2]
        if step + 1 < steps:
            nxt = orders[(step + 1) % 2]
            for s in seqs:
                s.tokens.append(-7)  # not known on the host yet
            plan = _decode_plan(planner, seqs, sampling, nxt)
            prev = np.array([order.index(i) for i in nxt], dtype=np.int32)
            ids = np.full(len(seqs), -1, dtype=np.int32)
            plan = dataclasses.replace(plan, input_ids=ids, prev_token_rows=prev)
            runner.submit(decorate(plan))
        out = runner.collect()
        landed()
        for row, i in enumerate(order):
            if step + 1 < steps:
                seqs[i].tokens[-1] = int(out.token_ids[row])  # the placeholder
            else:
                seqs[i].tokens.append(int(out.token_ids[row]))
    return [s.tokens for s in seqs]


@pytest.mark.parametrize("graphs", [False, True] if torch.cuda.is_available() else [False])
@pytest.mark.parametrize("seeded", [False, True])
def test_overlapped_steps_give_the_synchronous_tokens(
    device: str, graphs: bool, seeded: bool
) -> None:
    runner = _runner(device, graphs=graphs)
    assert runner.runner_config.overlap and runner.runner_config.max_draft_tokens == 8
    sampling = [SEEDED if seeded else Sampling()] * len(PROMPTS)
    steps = 5 if device == "cuda" else 3
    want = _sync_run(runner, sampling, steps)
    assert _overlapped_run(runner, sampling, steps) == want


@pytest.mark.parametrize("seeded", [False, True])
def test_pending_masks_are_sampled_after_they_are_ready(device: str, seeded: bool) -> None:
    runner = _runner(device, graphs=torch.cuda.is_available())
    vocab = runner.runner_config.vocab_size
    allowed = np.random.default_rng(3).choice(vocab, size=17, replace=False)
    bits = np.zeros(-(-vocab // 32) * 32, dtype=np.uint8)
    bits[allowed] = 1
    row = np.packbits(bits, bitorder="little").view(np.int32)
    sampling = [SEEDED if seeded else Sampling()] * len(PROMPTS)
    steps = 5 if device == "cuda" else 3

    def masked(plan: BatchPlan) -> BatchPlan:
        mask = np.tile(row, (plan.num_sequences, 1))
        return dataclasses.replace(
            plan, sampling=dataclasses.replace(plan.sampling, token_bitmask=mask)
        )

    gates: list[threading.Event] = []

    def gated(plan: BatchPlan) -> BatchPlan:
        gate = threading.Event()
        if not gates:
            gate.set()  # the first plan's mask is filled before it is submitted
        gates.append(gate)

        def wait() -> None:
            assert gate.is_set(), "a plan was sampled before its mask was ready"

        plan = masked(plan)
        return dataclasses.replace(
            plan, sampling=dataclasses.replace(plan.sampling, mask_pending=wait)
        )

    def landed() -> None:  # step n landed: plan n+1's mask is complete now
        for gate in gates:
            gate.set()

    want = _sync_run(runner, sampling, steps, masked)
    assert all(t in set(allowed.tolist()) for s, p in zip(want, PROMPTS, strict=True)
               for t in s[len(p) + 1 :])  # fmt: skip
    assert _overlapped_run(runner, sampling, steps, gated, landed) == want


def _verify(
    runner: Any, drafts: list[list[int]], sampling: list[Sampling], base: list[list[int]]
) -> list[list[int]]:
    """Prefill, then one verify step whose rows carry `drafts` after their first decode input."""
    planner = PagedPlanner(160, 4)
    seqs = _prefill(runner, planner, sampling)
    rows = []
    for s, d in zip(seqs, drafts, strict=True):
        s.tokens.extend(d)
        rows.append((s, 1 + len(d)))
    plan = planner.plan(rows, Phase.DECODE, sampling, [0] * len(seqs))
    counts = [len(d) for d in drafts]
    plan = dataclasses.replace(
        plan,
        draft_indptr=np.concatenate([[0], np.cumsum(counts)]).astype(np.int32),
        draft_ids=np.asarray([t for d in drafts for t in d], dtype=np.int32),
        sampling=dataclasses.replace(plan.sampling, output_index=np.ones(len(seqs), np.int32)),
    )
    out = runner.forward(plan)
    ends = out.token_indptr
    got = [out.token_ids[ends[i] : ends[i + 1]].tolist() for i in range(len(seqs))]
    return [b[: len(p) + 1] + g for b, p, g in zip(base, PROMPTS, got, strict=True)]


@pytest.mark.parametrize("graphs", [False, True] if torch.cuda.is_available() else [False])
@pytest.mark.parametrize("seeded", [False, True])
@pytest.mark.parametrize("max_batch", [8, 2])  # 2: three rows take the varlen (eager) path
def test_verify_returns_the_accepted_prefix_and_one_token(
    device: str, graphs: bool, seeded: bool, max_batch: int
) -> None:
    runner = _runner(device, graphs=graphs, max_batch=max_batch)
    sampling = [SEEDED if seeded else Sampling()] * len(PROMPTS)
    steps = 5
    base = _sync_run(runner, sampling, steps)  # prompt, first token, `steps` decode tokens
    cont = [b[len(p) + 1 :] for b, p in zip(base, PROMPTS, strict=True)]
    # Row 0: all 4 drafts right (4 + bonus); row 1: the third draft wrong (2 + correction);
    # row 2: one wrong draft first (0 + correction).
    drafts = [cont[0][:4], [*cont[1][:2], (cont[1][2] + 1) % 256], [(cont[2][0] + 3) % 256]]
    got = _verify(runner, drafts, sampling, base)
    assert got[0] == base[0][: len(PROMPTS[0]) + 6]
    assert got[1] == base[1][: len(PROMPTS[1]) + 4]
    assert got[2] == base[2][: len(PROMPTS[2]) + 2]


def test_misuse_is_refused(device: str) -> None:
    runner = _runner(device, graphs=False, max_draft_tokens=2)
    planner = PagedPlanner(160, 4)
    with pytest.raises(RuntimeError, match="without a submitted plan"):
        runner.collect()
    seqs = _prefill(runner, planner, [Sampling()] * 3)
    plan = _decode_plan(planner, seqs, [Sampling()] * 3, [0, 1, 2])
    bad = dataclasses.replace(plan, prev_token_rows=np.array([0, 7, -1], dtype=np.int32))
    with pytest.raises(ValueError, match="prev_token_rows"):
        runner.submit(bad)
    runner.submit(plan)
    runner.submit(plan)
    with pytest.raises(RuntimeError, match="in flight"):
        runner.submit(plan)
    with pytest.raises(RuntimeError, match="uncollected"):
        runner.forward(plan)
    runner.collect()
    runner.collect()
    many = dataclasses.replace(
        plan,
        draft_indptr=np.array([0, 3, 3, 3], dtype=np.int32),
        draft_ids=np.array([1, 2, 3], dtype=np.int32),
    )
    with pytest.raises(ValueError, match="max_draft_tokens"):
        runner.submit(many)
