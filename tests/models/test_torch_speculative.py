"""Speculative decoding with the reference runner on tiny random models (fp32 CPU).

- Greedy text is identical with and without speculation (n-gram and draft-model proposers),
  under batching, chunked prefill, prefix hits, retraction from a small page pool, stop tokens
  inside accepted drafts, aborts, and a Window-attention model.
- Sampling through the engine follows the target distribution: 20k requests whose drafts are
  verified at temperature 1 with top-k 6; every verified position is compared with the exact
  distribution from `transformers` (chi-square, p > 0.01).
"""

from __future__ import annotations

import functools
import math
from collections import Counter
from collections.abc import Sequence

import numpy as np
import pytest
import torch
from ref_compare import hf_logits
from ref_hf import checkpoint
from test_torch_verify import chi_square_p

from resin import Engine, SamplingParams
from resin.engine.proposers import DraftModelProposer, NgramProposer
from resin.engine.request import Request
from resin.engine.speculative import Speculation
from resin_models_torch.registry import load_runner


def _prompts() -> list[list[int]]:
    gen = torch.Generator().manual_seed(3)
    shared = torch.randint(0, 300, (13,), generator=gen).tolist()
    loop = [5, 17, 42, 99, 7] * 3  # repeats give the n-gram proposer something to find
    return [
        [*shared, 1, 2, 3],
        loop,
        shared + loop[:7],
        torch.randint(0, 300, (6,), generator=gen).tolist(),
        [*shared, 1, 2, 3],  # an exact repeat: a prefix hit
        [int(torch.randint(0, 300, (1,), generator=gen))],
    ]


def _generate(
    arch: str,
    speculation: Speculation | None,
    *,
    num_pages: int | None = None,
    chunk: int = 2048,
    params: SamplingParams | None = None,
    abort_after: int | None = None,
) -> tuple[list[list[int]], Engine]:
    folder, _ = checkpoint(arch)
    # overlap=False: steps land as they are taken, so `abort_after` and the retraction
    # scenarios count the same steps on a loaded machine.
    runner = load_runner(folder, page_size=4, num_pages=num_pages, overlap=False)
    engine = Engine(runner, context_length=96, prefix_cache=True, prefill_chunk_tokens=chunk,
                    max_sequences=8, speculation=speculation)  # fmt: skip
    params = params or SamplingParams(max_output_tokens=24, temperature=0.0)
    handles = []
    steps = 0
    for prompt in _prompts():
        handles.append(engine.submit(prompt, params))
        engine.step()  # later prompts arrive while earlier ones run
    while engine.has_work():
        steps += 1
        if abort_after is not None and steps == abort_after:
            engine.abort(handles[1])
        engine.step()
        engine.check_invariants()
    return [list(h.output_token_ids) for h in handles], engine


def _draft_proposer(arch: str) -> DraftModelProposer:
    folder, _ = checkpoint(arch)
    return DraftModelProposer(load_runner(folder, page_size=4), context_length=96)


SETUPS = {
    "batched": {},
    "chunk3-retract": {"num_pages": 30, "chunk": 3},
}


@pytest.mark.parametrize("setup", sorted(SETUPS))
@pytest.mark.parametrize("proposer", ["ngram", "draft"])
@pytest.mark.parametrize("arch", ["smollm2", "mistral"])
def test_greedy_text_is_identical_with_speculation(arch: str, proposer: str, setup: str) -> None:
    knobs = dict(SETUPS[setup])
    if arch == "mistral" and "num_pages" in knobs:
        knobs["num_pages"] = 5  # sliding-window only: a request holds a few pages
    plain, _ = _generate(arch, None, **knobs)  # type: ignore[arg-type]
    prop = NgramProposer(min_ngram=1) if proposer == "ngram" else _draft_proposer(arch)
    spec, engine = _generate(arch, Speculation(prop, 4), **knobs)  # type: ignore[arg-type]
    assert spec == plain
    snap = engine.metrics
    assert snap is not None and snap.spec_decode_num_accepted_tokens > 0
    if proposer == "draft":  # the same weights: every draft is right
        assert snap.spec_decode_num_accepted_tokens == snap.spec_decode_num_draft_tokens
    if knobs.get("num_pages"):
        assert snap.num_preemptions > 0


def test_stops_and_aborts_with_speculation_match_plain_runs() -> None:
    plain, _ = _generate("smollm2", None)
    stops = sorted({row[5] for row in plain if len(row) > 5})[:2]
    params = SamplingParams(max_output_tokens=24, temperature=0.0, stop_token_ids=stops)
    want, _ = _generate("smollm2", None, params=params)
    got, _engine = _generate("smollm2", Speculation(_draft_proposer("smollm2"), 6), params=params,
                            abort_after=3)  # fmt: skip
    assert [len(r) for r in got] != [24] * len(got), "some row stopped early"
    assert got[0] == want[0] and got[2:] == want[2:]
    assert got[1] == want[1][: len(got[1])] and len(got[1]) < len(want[1])  # aborted early


class FixedProposer:
    """Always proposes the same drafts."""

    def __init__(self, drafts: Sequence[int]) -> None:
        self.drafts = list(drafts)

    def propose(self, requests: Sequence[Request], limits: Sequence[int]) -> list[list[int]]:
        return [self.drafts[:k] for k in limits]


def _target(hf: object, tokens: list[int], top_k: int) -> np.ndarray:
    logits = hf_logits(hf, tokens)[-1].double()
    kept = logits.topk(top_k).indices
    probs = torch.zeros_like(logits)
    probs[kept] = torch.softmax(logits[kept], -1)
    return probs.numpy()


def test_speculative_sampling_matches_the_target_distribution(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """20k requests: t1 is sampled by the prefill, then one verify step with drafts
    [d0, d1] returns x0 (p(. | P t1)), x1 when x0 == d0 (p(. | P t1 d0)), x2 when x1 == d1.
    The schedule is pinned (no decode-wait clock: a loaded machine's slow steps let decodes
    preempt prefills at other points, so the seeded draws fell on other rows and each p-value
    was a fresh 1% chance of a false failure; it failed once so in a full run)."""
    from resin.engine import engine as engine_module

    config = functools.partial(engine_module.EngineConfig, max_decode_wait_s=math.inf)
    monkeypatch.setattr(engine_module, "EngineConfig", config)
    folder, hf = checkpoint("smollm2")
    n, top_k = 20_000, 6
    prompt = [11, 22, 33, 44, 55, 66, 77]
    p1 = _target(hf, prompt, top_k)
    t1 = int(p1.argmax())
    px0 = _target(hf, [*prompt, t1], top_k)
    d0 = int(px0.argmax())
    px1 = _target(hf, [*prompt, t1, d0], top_k)
    d1 = int(px1.argmax())
    runner = load_runner(folder, page_size=4, seed=1, overlap=False)  # the same draws each run
    engine = Engine(runner, context_length=32, prefix_cache=True, max_sequences=4096,
                    max_batch_tokens=16384,
                    speculation=Speculation(FixedProposer([d0, d1]), 2))  # fmt: skip
    params = SamplingParams(max_output_tokens=4, temperature=1.0, top_k=top_k)
    handles = [engine.submit(prompt, params) for _ in range(n)]
    while engine.has_work():
        engine.step()
    outs = [h.take_result() for h in handles]
    first = Counter(o[0] for o in outs)
    assert chi_square_p(_counts(first), p1 * n) > 0.01
    rows = [o for o in outs if o[0] == t1]
    x0 = Counter(o[1] for o in rows)
    assert chi_square_p(_counts(x0), px0 * len(rows)) > 0.01
    after_d0 = [o for o in rows if o[1] == d0]
    x1 = Counter(o[2] for o in after_d0)
    assert len(after_d0) > 2000
    assert chi_square_p(_counts(x1), px1 * len(after_d0)) > 0.01
    snap = engine.metrics
    assert snap is not None and snap.spec_decode_num_accepted_tokens > 0.3 * n


def _counts(counter: Counter[int]) -> np.ndarray:
    out = np.zeros(300)
    for token, count in counter.items():
        out[token] = count
    return out
