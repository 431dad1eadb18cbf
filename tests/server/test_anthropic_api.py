"""The official `anthropic` SDK against a live server (fake engine, byte ChatML format)."""

from __future__ import annotations

import anthropic
import httpx
import pytest

from tests.server.conftest import MODEL

TOOL = {
    "name": "get_weather",
    "description": "Weather in a city",
    "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}},
}


@pytest.fixture(scope="module")
def client(url: str) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=url, api_key="unused", max_retries=0)


def test_messages_create_and_stream(client: anthropic.Anthropic) -> None:
    msg = client.messages.create(
        model=MODEL, max_tokens=64, system="be brief", messages=[{"role": "user", "content": "hey"}]
    )
    assert [b.type for b in msg.content] == ["text"]
    assert msg.content[0].text == "You said: hey"  # type: ignore[union-attr]
    assert msg.stop_reason == "end_turn" and msg.usage.input_tokens > 0
    with client.messages.stream(
        model=MODEL, max_tokens=64, messages=[{"role": "user", "content": "hey"}]
    ) as stream:
        kinds = [e.type for e in stream]
        final = stream.get_final_message()
    assert kinds[0] == "message_start" and kinds[-1] == "message_stop"
    assert final.content[0].text == "You said: hey"  # type: ignore[union-attr]
    assert final.usage.output_tokens == msg.usage.output_tokens


def test_thinking_and_tool_use_blocks(client: anthropic.Anthropic) -> None:
    with client.messages.stream(
        model=MODEL,
        max_tokens=64,
        thinking={"type": "enabled", "budget_tokens": 1024},
        messages=[{"role": "user", "content": "think please"}],
    ) as stream:
        final = stream.get_final_message()
    assert [b.type for b in final.content] == ["thinking", "text"]
    assert final.content[0].thinking == "The user wants me to think."  # type: ignore[union-attr]
    tool_msg = client.messages.create(
        model=MODEL,
        max_tokens=64,
        tools=[TOOL],  # type: ignore[list-item]
        messages=[{"role": "user", "content": "weather in Paris"}],
    )
    assert tool_msg.stop_reason == "tool_use"
    (use,) = [b for b in tool_msg.content if b.type == "tool_use"]
    assert use.name == "get_weather" and use.input == {"city": "Paris"}
    with client.messages.stream(
        model=MODEL,
        max_tokens=64,
        tools=[TOOL],  # type: ignore[list-item]
        messages=[{"role": "user", "content": "weather in Paris"}],
    ) as stream:
        streamed = stream.get_final_message()
    assert [b.type for b in streamed.content] == ["tool_use"]
    assert streamed.content[0].input == {"city": "Paris"}  # type: ignore[union-attr]
    answer = client.messages.create(
        model=MODEL,
        max_tokens=64,
        tools=[TOOL],  # type: ignore[list-item]
        messages=[
            {"role": "user", "content": "weather in Paris"},
            {"role": "assistant", "content": [use.model_dump()]},  # type: ignore[list-item]
            {
                "role": "user",
                "content": [{"type": "tool_result", "tool_use_id": use.id, "content": "sunny"}],
            },
        ],
    )
    assert answer.stop_reason == "end_turn"


def test_stop_sequence_and_max_tokens(client: anthropic.Anthropic) -> None:
    msg = client.messages.create(
        model=MODEL,
        max_tokens=64,
        stop_sequences=["said"],
        messages=[{"role": "user", "content": "x"}],
    )
    assert msg.stop_reason == "stop_sequence" and msg.stop_sequence == "said"
    assert msg.content[0].text == "You "  # type: ignore[union-attr]
    short = client.messages.create(
        model=MODEL, max_tokens=3, messages=[{"role": "user", "content": "x"}]
    )
    assert short.stop_reason == "max_tokens" and short.usage.output_tokens == 3


def test_anthropic_error_shape(url: str, client: anthropic.Anthropic) -> None:
    with pytest.raises(anthropic.BadRequestError) as err:
        client.messages.create(
            model=MODEL, max_tokens=0, messages=[{"role": "user", "content": "x"}]
        )
    assert err.value.status_code == 400
    body = httpx.post(url + "/v1/messages", json={"model": MODEL, "messages": []}).json()
    assert body["type"] == "error" and body["error"]["type"] == "invalid_request_error"


def test_count_tokens(client: anthropic.Anthropic) -> None:
    messages = [{"role": "user", "content": "hey"}]
    counted = client.messages.count_tokens(model=MODEL, messages=messages)  # type: ignore[arg-type]
    sent = client.messages.create(model=MODEL, max_tokens=4, messages=messages)  # type: ignore[arg-type]
    cached = sent.usage.cache_read_input_tokens or 0
    assert counted.input_tokens == sent.usage.input_tokens + cached > 0


def test_input_tokens_exclude_cache_reads(client: anthropic.Anthropic) -> None:
    """Anthropic's meaning: the prompt is input_tokens + cache_read_input_tokens (+ creation);
    a repeated long prompt reads most of itself from the prefix cache."""
    messages = [{"role": "user", "content": "a long shared document. " * 20}]
    counted = client.messages.count_tokens(model=MODEL, messages=messages)  # type: ignore[arg-type]
    client.messages.create(model=MODEL, max_tokens=2, messages=messages)  # type: ignore[arg-type]
    again = client.messages.create(model=MODEL, max_tokens=2, messages=messages)  # type: ignore[arg-type]
    cached = again.usage.cache_read_input_tokens or 0
    assert cached > 0 and again.usage.cache_creation_input_tokens == 0
    assert again.usage.input_tokens + cached == counted.input_tokens
    assert again.usage.input_tokens < counted.input_tokens
    # message_start says the same before any token (litellm's stream usage reads it).
    with client.messages.stream(model=MODEL, max_tokens=2, messages=messages) as stream:  # type: ignore[arg-type]
        start = next(e for e in stream if e.type == "message_start").message.usage
    assert start.input_tokens == again.usage.input_tokens
    assert start.cache_read_input_tokens == cached


def test_unknown_model_is_404_as_on_the_openai_routes(client: anthropic.Anthropic) -> None:
    messages = [{"role": "user", "content": "hey"}]
    with pytest.raises(anthropic.NotFoundError) as err:
        client.messages.create(model="other-model", max_tokens=4, messages=messages)  # type: ignore[arg-type]
    assert err.value.body["error"]["type"] == "not_found_error"  # type: ignore[index]
    with pytest.raises(anthropic.NotFoundError):
        client.messages.count_tokens(model="other-model", messages=messages)  # type: ignore[arg-type]
