"""Logprobs and prompt logprobs travel from the runner's columns to the right events."""

from __future__ import annotations

import pytest

from resin import Engine, History, SamplingParams, TokensEvent, TopLogprob
from tests.engine.fakes import CacheSimRunner, fake_logprob, naive_generate


def test_logprobs_and_chunked_prompt_logprobs_reach_the_events() -> None:
    runner = CacheSimRunner(page_size=4, num_pages=64, vocab=50)
    engine = Engine(runner, context_length=64, prefill_chunk_tokens=3)
    prompt = [5, 17, 3, 44, 12, 9, 30, 2, 8, 41]
    asks = SamplingParams(max_output_tokens=4, logprobs=2, prompt_logprobs=1)
    plain = SamplingParams(max_output_tokens=4)
    a = engine.submit(prompt, asks)
    b = engine.submit(prompt[:4], plain)
    events: dict[int, list[TokensEvent]] = {a.id: [], b.id: []}
    while engine.has_work():
        for e in engine.step():
            if isinstance(e, TokensEvent):
                events[e.request_id].append(e)
    first = events[a.id][0]
    assert first.prompt_logprobs == pytest.approx([fake_logprob(t) for t in prompt[1:]])
    assert first.prompt_top_logprobs is not None and len(first.prompt_top_logprobs) == 9
    assert first.prompt_top_logprobs[0] == (TopLogprob(prompt[1] + 1, fake_logprob(prompt[1] + 1)),)
    for e in events[a.id]:
        (tok,) = e.token_ids
        assert e.logprobs == pytest.approx((fake_logprob(tok),))
        assert e.top_logprobs is not None
        assert [t.token_id for t in e.top_logprobs[0]] == [tok + 1, tok + 2]
    assert all(e.prompt_logprobs is None for e in events[a.id][1:])
    assert all(e.logprobs is None and e.prompt_logprobs is None for e in events[b.id])
    want, _ = naive_generate((History(),), prompt, asks, 50, 64)
    assert a.take_result() == want
