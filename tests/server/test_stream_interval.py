"""`stream_interval=k`: after the first token, each streamed event carries at least k tokens'
text as one delta (the engine makes one token per step here), and nothing is lost."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager

import anthropic
import openai

from tests.server.conftest import MODEL
from tests.server.doubles import FakeEngine

PROMPT = "tell me a long enough story"


def _check(pieces: list[str], whole: str) -> None:
    assert "".join(pieces) == whole
    assert len(pieces) >= 3
    # The byte tokenizer makes one character per token: the first piece is sent at once (time
    # to first token), the middle ones hold at least 4 tokens, the last may hold fewer.
    assert all(len(p) >= 4 for p in pieces[1:-1]), pieces


def test_chat_chunks_carry_stream_interval_tokens(
    serve: Callable[..., AbstractContextManager[str]],
) -> None:
    with serve(FakeEngine(step_delay=0.001), stream_interval=4) as url:
        client = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0)
        messages = [{"role": "user", "content": PROMPT}]
        whole = client.chat.completions.create(model=MODEL, messages=messages, temperature=0)
        stream = client.chat.completions.create(
            model=MODEL, messages=messages, temperature=0, stream=True
        )
        pieces = [c.choices[0].delta.content or "" for c in stream if c.choices]
    _check([p for p in pieces if p], whole.choices[0].message.content or "")


def test_anthropic_text_deltas_carry_stream_interval_tokens(
    serve: Callable[..., AbstractContextManager[str]],
) -> None:
    with serve(FakeEngine(step_delay=0.001), stream_interval=4) as url:
        client = anthropic.Anthropic(base_url=url, api_key="unused", max_retries=0)
        messages = [{"role": "user", "content": PROMPT}]
        with client.messages.stream(model=MODEL, max_tokens=200, messages=messages) as stream:
            pieces = [
                e.delta.text
                for e in stream
                if e.type == "content_block_delta" and e.delta.type == "text_delta"
            ]
            final = stream.get_final_message()
    _check(pieces, "".join(b.text for b in final.content if b.type == "text"))
