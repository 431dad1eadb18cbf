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
PREFILL = "The capital of France is"
OPENED_CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city":'
TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    },
}


@pytest.fixture(scope="module")
def url() -> Iterator[str]:
    default_model = pytest.importorskip("resin_model.default_model")
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
        if text.endswith(PREFILL):  # a continued assistant message
            return [*tok.encode(" Paris."), end]
        if text.endswith(OPENED_CALL):
            return [*tok.encode(' "Paris"}}\n</tool_call>'), end]
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
    default_model = pytest.importorskip("resin_model.default_model")
    from resin.recipe import Message
    from resin.tokenizer import Tokenizer
    from resin_app.loading import recipe_for

    try:
        tok = Tokenizer.from_dir(default_model.default_model_dir())
    except (FileNotFoundError, ImportError) as exc:
        pytest.skip(f"default model unavailable: {exc}")
    text = recipe_for(tok, None).render([Message("user", "Hi")]).text
    assert text.startswith("<|im_start|>system\nYou are a helpful AI assistant named SmolLM")
    assert text.endswith("<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n")


def test_anthropic_prefill_is_continued_not_repeated(url: str) -> None:
    """A last assistant message is continued: the prompt ends with it (no closed turn, no new
    one) and the answer holds only what the model added, stream and not."""
    client = anthropic.Anthropic(base_url=url, api_key="x", max_retries=0)
    messages = [
        {"role": "user", "content": "Capital of France?"},
        {"role": "assistant", "content": PREFILL},
    ]
    r = client.messages.create(model="smol", max_tokens=20, messages=messages)  # type: ignore[arg-type]
    assert [(b.type, b.text) for b in r.content] == [("text", " Paris.")]  # type: ignore[union-attr]
    assert r.stop_reason == "end_turn"
    count = client.messages.count_tokens(model="smol", messages=messages)  # type: ignore[arg-type]
    assert count.input_tokens == r.usage.input_tokens + (r.usage.cache_read_input_tokens or 0)
    with client.messages.stream(model="smol", max_tokens=20, messages=messages) as stream:  # type: ignore[arg-type]
        assert "".join(stream.text_stream) == " Paris."
    bad = [messages[0], {"role": "assistant", "content": PREFILL + " "}]
    with pytest.raises(anthropic.BadRequestError, match="trailing whitespace"):
        client.messages.create(model="smol", max_tokens=20, messages=bad)  # type: ignore[arg-type]


def test_prefill_that_opens_a_tool_call_returns_the_whole_call(url: str) -> None:
    """The tool-call parser starts where the prefill left it: the model's continuation closes
    the call the prefill opened, and the client gets one whole tool call."""
    client = anthropic.Anthropic(base_url=url, api_key="x", max_retries=0)
    tool = {"name": "get_weather", "input_schema": TOOL["function"]["parameters"]}  # type: ignore[index]
    r = client.messages.create(
        model="smol",
        max_tokens=40,
        tools=[tool],  # type: ignore[list-item]
        messages=[
            {"role": "user", "content": "Weather in Paris?"},
            {"role": "assistant", "content": OPENED_CALL},
        ],
    )
    assert [(b.type, b.input) for b in r.content] == [("tool_use", {"city": "Paris"})]  # type: ignore[union-attr]
    assert r.stop_reason == "tool_use"


def test_openai_continue_final_message(url: str) -> None:
    """vLLM's `continue_final_message` on chat completions does the same."""
    client = openai.OpenAI(base_url=url + "/v1", api_key="x", max_retries=0)
    messages = [
        {"role": "user", "content": "Capital of France?"},
        {"role": "assistant", "content": PREFILL},
    ]
    r = client.chat.completions.create(
        model="smol",
        messages=messages,  # type: ignore[arg-type]
        extra_body={"continue_final_message": True, "add_generation_prompt": False},
    )
    assert r.choices[0].message.content == " Paris."
    fresh = client.chat.completions.create(model="smol", messages=messages)  # type: ignore[arg-type]
    assert fresh.choices[0].message.content == "It is sunny in Paris."  # a new turn
    with pytest.raises(openai.BadRequestError, match="the assistant's"):
        client.chat.completions.create(
            model="smol",
            messages=messages[:1],  # type: ignore[arg-type]
            extra_body={"continue_final_message": True},
        )
