"""Prompt logprobs on the fast runner against the reference runner on the same weights, through
the Engine, in float32 (CPU: the Triton interpreter): chunked prefill (8-token chunks, so
chunk boundaries fall inside the prompts and a chunk's last token takes the next chunk's
first token as its target; the LM head runs over 3 tokens at a time), batches that mix
prompt-logprob rows with rows that hit the prefix cache, and a prompt-logprob request whose
prompt the cache holds (the engine computes every prompt token for such a request; its
values equal a cold run's). Values within float32 tolerance, the top-k ids identical."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from resin import Engine, SamplingParams
from resin.events import ErrorEvent
from resin_model.presets import TINY
from tests.cuda.test_vs_reference import reference_and_fast

ATOL = 2e-4


def _run(runner: Any, rounds: list[list[tuple[list[int], SamplingParams]]]) -> list[Any]:
    """Each round's requests submitted together; per request: cached tokens, prompt logprobs,
    prompt top-k (ids, logprobs), output tokens and their logprobs."""
    out = []
    with Engine(runner, context_length=100, prefix_cache=True, prefill_chunk_tokens=8,
                max_batch_tokens=40, max_sequences=8) as engine:  # fmt: skip
        for requests in rounds:
            handles = [engine.submit(p, s) for p, s in requests]
            events: dict[int, list[Any]] = {h.id: [] for h in handles}
            while engine.has_work():
                for event in engine.step():
                    assert not isinstance(event, ErrorEvent), event.message
                    events.setdefault(event.request_id, []).append(event)
            for h in handles:
                first = next(e for e in events[h.id] if hasattr(e, "prompt_logprobs"))
                top = first.prompt_top_logprobs or ()
                out.append(
                    (
                        h.cached_tokens,
                        np.asarray(first.prompt_logprobs, dtype=np.float64)
                        if first.prompt_logprobs is not None
                        else None,
                        [[t.token_id for t in row] for row in top],
                        np.asarray([[t.logprob for t in row] for row in top]),
                        list(h.output_token_ids),
                    )
                )
    return out


def _compare(fast: list[Any], ref: list[Any]) -> None:
    for f, r in zip(fast, ref, strict=True):
        assert f[0] == r[0] and f[4] == r[4]  # cached tokens, greedy output
        if r[1] is None:
            assert f[1] is None
            continue
        assert f[1] is not None and f[1].shape == r[1].shape
        np.testing.assert_allclose(f[1], r[1], atol=ATOL, rtol=0)
        assert f[2] == r[2]
        if r[3].size:
            np.testing.assert_allclose(f[3], r[3], atol=ATOL, rtol=0)


def _rounds(vocab: int) -> list[list[tuple[list[int], SamplingParams]]]:
    rng = np.random.default_rng(11)
    shared = rng.integers(0, vocab, size=13).tolist()
    a = shared + rng.integers(0, vocab, size=6).tolist()  # 19 tokens: three 8-token chunks
    b = shared + rng.integers(0, vocab, size=3).tolist()
    c = rng.integers(0, vocab, size=5).tolist()

    def params(prompt_k: int | None) -> SamplingParams:
        return SamplingParams(
            max_output_tokens=2, temperature=0.0, ignore_stop_tokens=True, prompt_logprobs=prompt_k
        )

    return [
        [(a, params(3)), (c, params(None))],  # chunked, beside a plain row
        # b hits the prefix a left; a again with prompt logprobs (computed whole, top-0);
        # c with top-5 (its one chunk)
        [(b, params(None)), (a, params(0)), (c, params(5))],
    ]


@pytest.mark.parametrize("arch", ["llama", "gemma3"])
def test_prompt_logprobs_match_the_reference_runner(
    device: str, arch: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from resin_models_cuda import prompt_logprobs

    monkeypatch.setattr(prompt_logprobs, "ELEMENTS", 3 * 256)  # 3 tokens per LM-head chunk
    reference, fast = reference_and_fast(TINY[arch], device)
    rounds = _rounds(256)
    want = _run(reference, rounds)
    got = _run(fast, rounds)
    _compare(got, want)
    cached = [entry[0] for entry in got]
    assert cached[2] > 0 and cached[3] == 0  # b hit; a with prompt logprobs computed whole
    first_a, second_a = got[0], got[3]
    assert first_a[1] is not None and second_a[1] is not None
    assert first_a[1].shape == (18,)  # every prompt token but the first has one
    np.testing.assert_allclose(second_a[1], first_a[1], atol=ATOL, rtol=0)
    assert len(first_a[2]) == 18 and len(first_a[2][0]) == 3 and second_a[2] == []
    assert got[1][1] is None and len(got[4][2]) == 4 and len(got[4][2][0]) == 5
