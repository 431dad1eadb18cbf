"""A real tokenizer (SmolLM2's) and a real `resin.recipe` recipe behind the server, with the
scripted engine producing the tokens: tool calls parsed by the recipe reach both SDKs."""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence

import anthropic
import openai
import pytest

from resin.server import HttpServer
from resin.server.launch import free_port, running
from tests.server.doubles import FakeEngine

CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    },
}


@pytest.fixture(scope="module")
def url() -> Iterator[str]:
    default_model = pytest.importorskip("resin_models_torch.default_model")
    from resin.recipe import get_native_recipe
    from resin.tokenizer import Tokenizer

    try:
        tok = Tokenizer.from_dir(default_model.default_model_dir())
    except (FileNotFoundError, ImportError) as exc:
        pytest.skip(f"default model unavailable: {exc}")
    recipe = get_native_recipe("chatml", tok)
    end = recipe.stop_token_ids[0]

    def respond(prompt: Sequence[int]) -> list[int]:
        text = tok.decode(prompt)
        if "<tools>" in text and "<tool_response>" not in text:
            return [*tok.encode(CALL), end]
        return [*tok.encode("It is sunny in Paris."), end]

    engine = FakeEngine(respond, vocab_size=tok.vocab_size, context_length=2048)
    server = HttpServer(engine, recipe, tokenizer=tok, model="smol", port=free_port())
    with running(server) as base:
        yield base


def test_openai_tool_call_round_trip(url: str) -> None:
    client = openai.OpenAI(base_url=url + "/v1", api_key="x", max_retries=0)
    ask = [{"role": "user", "content": "Weather in Paris?"}]
    r = client.chat.completions.create(model="smol", messages=ask, tools=[TOOL])  # type: ignore[arg-type, list-item]
    (call,) = r.choices[0].message.tool_calls or []
    assert r.choices[0].finish_reason == "tool_calls" and r.choices[0].message.content is None
    assert json.loads(call.function.arguments) == {"city": "Paris"}  # type: ignore[union-attr]
    chunks = list(
        client.chat.completions.create(model="smol", messages=ask, tools=[TOOL], stream=True)  # type: ignore[arg-type, list-item]
    )
    args = "".join(
        tc.function.arguments or ""
        for c in chunks
        if c.choices
        for tc in c.choices[0].delta.tool_calls or []
        if tc.function
    )
    assert json.loads(args) == {"city": "Paris"}
    follow = client.chat.completions.create(
        model="smol",
        tools=[TOOL],  # type: ignore[list-item]
        messages=[
            *ask,
            {"role": "assistant", "tool_calls": [call.model_dump()]},  # type: ignore[list-item]
            {"role": "tool", "tool_call_id": call.id, "content": "sunny"},
        ],  # type: ignore[list-item]
    )
    assert follow.choices[0].message.content == "It is sunny in Paris."


def test_anthropic_tool_use(url: str) -> None:
    client = anthropic.Anthropic(base_url=url, api_key="x", max_retries=0)
    tool = {"name": "get_weather", "input_schema": TOOL["function"]["parameters"]}  # type: ignore[index]
    with client.messages.stream(
        model="smol",
        max_tokens=100,
        tools=[tool],  # type: ignore[list-item]
        messages=[{"role": "user", "content": "Weather in Paris?"}],
    ) as stream:
        final = stream.get_final_message()
    assert final.stop_reason == "tool_use"
    assert [b.type for b in final.content] == ["tool_use"]
    assert final.content[0].input == {"city": "Paris"}  # type: ignore[union-attr]


def test_default_model_keeps_its_default_system_prompt() -> None:
    default_model = pytest.importorskip("resin_models_torch.default_model")
    from resin.loading import recipe_for
    from resin.recipe import Message
    from resin.tokenizer import Tokenizer

    try:
        tok = Tokenizer.from_dir(default_model.default_model_dir())
    except (FileNotFoundError, ImportError) as exc:
        pytest.skip(f"default model unavailable: {exc}")
    text = recipe_for(tok, None).render([Message("user", "Hi")]).text
    assert text.startswith("<|im_start|>system\nYou are a helpful AI assistant named SmolLM")
    assert text.endswith("<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n")
