"""Multi-token steps (a speculative engine's verify steps) through the server: a stop string
inside a step's tokens ends the output, the token count and the logprobs exactly where
one-token steps would (fake engine, official `openai` SDK)."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any

import openai

from tests.server.conftest import MODEL
from tests.server.doubles import FakeEngine


def _ask(url: str, **kwargs: Any) -> tuple[Any, Any]:
    client = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0)
    common = {"model": MODEL, "messages": [{"role": "user", "content": "one two three four"}],
              "max_tokens": 60, "logprobs": True, "top_logprobs": 2, **kwargs}  # fmt: skip
    full = client.chat.completions.create(**common)
    usage = {"include_usage": True}
    chunks = list(client.chat.completions.create(**common, stream=True, stream_options=usage))
    return full, chunks


def test_stop_strings_inside_multi_token_steps_cut_like_one_token_steps(
    serve: Callable[..., AbstractContextManager[str]],
) -> None:
    results = []
    for per_step in (1, 5):
        with serve(FakeEngine(tokens_per_step=per_step), stream_interval=3) as url:
            results.append(_ask(url, stop=["two t"]))
    (full1, chunks1), (full5, chunks5) = results
    assert full1.choices[0].message.content == "You said: one "
    assert full5.choices[0].message.content == full1.choices[0].message.content
    assert full5.choices[0].finish_reason == full1.choices[0].finish_reason == "stop"
    assert full5.usage.completion_tokens == full1.usage.completion_tokens
    tokens1 = [e.token for e in full1.choices[0].logprobs.content]
    assert [e.token for e in full5.choices[0].logprobs.content] == tokens1
    streamed = ["".join(c.choices[0].delta.content or "" for c in ch if c.choices)
                for ch in (chunks1, chunks5)]  # fmt: skip
    assert streamed[0] == streamed[1] == "You said: one "
    assert chunks5[-1].usage.completion_tokens == chunks1[-1].usage.completion_tokens
