"""A grammar that hits a per-step limit mid-answer is the client's 400, never a 200 `stop`.

The real engine with the zero-cost runner (the token a grammar allows first, "a" here), the
default model's tokenizer and recipe, and a grammar backend whose `step_max_items` is 100: the
ambiguous grammar `e: e e | "a"` passes its first mask and runs out of Earley items after 9
tokens. Its row is then all zeros, the runner's token (the end-of-text token) means nothing,
and the answer is the grammar's failure: a 400 naming the limit (`invalid_request_error` in a
stream's last frame), not a complete `stop`."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import openai
import pytest

from resin.engine import Engine
from resin.engine.grammar import GrammarBackend
from resin.engine.grammar_compile import GrammarLimits
from resin.server import HttpServer
from resin.server.launch import free_port, running
from resin.tokenizer import Tokenizer
from resin_app.loading import ZeroCostRunner, recipe_for
from resin_model.default_model import default_model_dir

AMBIGUOUS = 'start: e\ne: e e | "a"\n'
LIMIT = "Too many items (limit 100"


@pytest.fixture(scope="module")
def url() -> Iterator[str]:
    tokenizer = Tokenizer.from_dir(default_model_dir())
    backend = GrammarBackend.from_tokenizer(tokenizer, GrammarLimits(step_max_items=100))
    runner = ZeroCostRunner(tokenizer.vocab_size, tokenizer.encode("a")[0])
    engine = Engine(runner, context_length=1024, grammar=backend)
    server = HttpServer(
        engine, recipe_for(tokenizer, None), tokenizer=tokenizer, model="fake",
        port=free_port(), context_length=1024,
    )  # fmt: skip
    with running(server) as base:
        yield base


def test_chat_and_completions_answer_the_failure_with_a_400(url: str) -> None:
    client = openai.OpenAI(base_url=url + "/v1", api_key="x", max_retries=0, timeout=60)
    with pytest.raises(openai.BadRequestError) as chat:
        client.chat.completions.create(
            model="fake", messages=[{"role": "user", "content": "hi"}], max_tokens=50,
            extra_body={"guided_grammar": AMBIGUOUS},
        )  # fmt: skip
    assert LIMIT in str(chat.value.body)
    with pytest.raises(openai.BadRequestError) as completion:
        client.completions.create(
            model="fake", prompt="hi", max_tokens=50, extra_body={"guided_grammar": AMBIGUOUS}
        )
    assert LIMIT in str(completion.value.body)
    # Cut by max_tokens before the limit: the grammar's prefix, a plain `length`.
    short = client.completions.create(
        model="fake", prompt="hi", max_tokens=4, extra_body={"guided_grammar": AMBIGUOUS}
    )
    assert short.choices[0].text == "aaaa" and short.choices[0].finish_reason == "length"


def test_a_stream_ends_with_an_invalid_request_frame(url: str) -> None:
    body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 50, "stream": True,
            "guided_grammar": AMBIGUOUS}  # fmt: skip
    text = httpx.post(url + "/v1/chat/completions", json=body, timeout=60).text
    frames = [f for f in text.split("\n\n") if f.strip()]
    assert '"finish_reason":"stop"' not in text and "[DONE]" not in text
    assert LIMIT in frames[-1] and '"type":"invalid_request_error"' in frames[-1]
