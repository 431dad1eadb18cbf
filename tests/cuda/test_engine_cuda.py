"""The Engine driving CudaRunner with overlap scheduling and with speculative decoding gives
exactly the tokens of a synchronous, non-speculative run: greedy and seeded sampling,
batching, chunked prefill, stops (max tokens) landing inside accepted drafts. Drafts come from
the n-gram proposer (prompts repeat a pattern) and from an oracle that knows the plain run's
tokens and proposes them, right for one request and with a wrong token for the others, so
acceptance, rejection and the bonus token are all exercised whatever the tiny model says."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch

from resin import Engine, SamplingParams
from resin.engine.proposers import NgramProposer
from resin.engine.request import Request
from resin.engine.speculative import Speculation
from resin_model.presets import TINY
from tests.cuda.test_vs_reference import reference_and_fast


def _fast(device: str) -> Any:
    from resin_models_cuda import CudaRunner

    _, fast = reference_and_fast(TINY["llama"], device)
    return lambda: CudaRunner(fast.model, fast.options)


def _prompts() -> list[list[int]]:
    rng = np.random.default_rng(5)
    motif = rng.integers(0, 256, size=6).tolist()
    return [motif * 3 + [7], rng.integers(0, 256, size=9).tolist(), motif * 2]


class Oracle:
    """Proposes the plain run's next tokens; every row but request 0's gets its 2nd one wrong."""

    def __init__(self, want: list[list[int]]) -> None:
        self.want = want

    def propose(self, requests: list[Request], limits: list[int]) -> list[list[int]]:
        out = []
        for r, k in zip(requests, limits, strict=True):
            done = len(r.output_token_ids)
            drafts = self.want[r.id][done : done + k]
            if r.id and len(drafts) > 1:
                drafts[1] = (drafts[1] + 1) % 256
            out.append(drafts)
        return out


def _run(runner: Any, params: list[SamplingParams], **engine_kw: Any) -> list[list[int]]:
    with Engine(runner, context_length=100, prefill_chunk_tokens=8, max_batch_tokens=40,
                max_sequences=8, **engine_kw) as engine:  # fmt: skip
        requests = [engine.submit(p, s) for p, s in zip(_prompts(), params, strict=True)]
        while engine.has_work():
            engine.step()
        spec = engine_kw.get("speculation")
        if spec is not None and isinstance(spec.proposer, Oracle):  # drafts were verified
            metrics = engine.metrics
            assert metrics is not None and metrics.spec_decode_num_draft_tokens > 0
            assert metrics.spec_decode_num_accepted_tokens > 0
        return [list(r.take_result()) for r in requests]


@pytest.mark.parametrize("seeded", [False, True])
def test_overlap_and_speculation_keep_the_tokens(device: str, seeded: bool) -> None:
    make = _fast(device)
    n = 8 if torch.cuda.is_available() else 5
    if seeded:
        params = [SamplingParams(max_output_tokens=n, temperature=0.7, seed=s,
                                 ignore_stop_tokens=True) for s in (1, 2, 3)]  # fmt: skip
    else:
        params = [SamplingParams(max_output_tokens=n, temperature=0.0, ignore_stop_tokens=True)] * 3
    want = _run(make(), params, overlap=False)
    assert _run(make(), params, overlap=True) == want
    spec = Speculation(NgramProposer(max_ngram=3, min_ngram=1), num_draft_tokens=3)
    assert _run(make(), params, speculation=spec) == want
    oracle = Speculation(Oracle(want), num_draft_tokens=3)
    assert _run(make(), params, speculation=oracle) == want
