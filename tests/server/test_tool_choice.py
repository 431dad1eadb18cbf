"""`tool_choice` is enforced: a real tokenizer (SmolLM2's) and the real chatml recipe behind the
server, the scripted engine continuing whatever the prompt forces. The scripted model answers
plain text unless the prompt ends inside a tool call, so a call only appears when forced."""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence

import anthropic
import openai
import pytest

from resin.server import HttpServer
from resin.server.launch import free_port, running
from tests.server.doubles import FakeEngine

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": name,
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
        },
    }
    for name in ("get_weather", "get_time")
]
ASK = [{"role": "user", "content": "Weather in Paris?"}]
ARGS = '{"city": "Paris"}'


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
        if text.endswith('"arguments": '):  # named: the model writes the arguments
            out = f"{ARGS}}}\n</tool_call>"
        elif text.endswith("<tool_call>\n"):  # required: the model picks a tool
            out = f'{{"name": "get_time", "arguments": {ARGS}}}\n</tool_call>'
        else:
            out = "Let me think about that."
        return [*tok.encode(out), end]

    engine = FakeEngine(respond, vocab_size=tok.vocab_size, context_length=2048)
    server = HttpServer(engine, recipe, tokenizer=tok, model="smol", port=free_port())
    with running(server) as base:
        yield base


def _openai(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=url + "/v1", api_key="x", max_retries=0)


def test_chat_auto_required_and_named(url: str) -> None:
    client = _openai(url)
    auto = client.chat.completions.create(model="smol", messages=ASK, tools=TOOLS)  # type: ignore[arg-type]
    assert auto.choices[0].message.tool_calls is None
    assert auto.choices[0].message.content == "Let me think about that."
    required = client.chat.completions.create(
        model="smol",
        messages=ASK,  # type: ignore[arg-type]
        tools=TOOLS,  # type: ignore[arg-type]
        tool_choice="required",
    )
    (call,) = required.choices[0].message.tool_calls or []
    assert call.function.name == "get_time"  # type: ignore[union-attr]
    assert required.choices[0].finish_reason == "tool_calls"
    named = {"type": "function", "function": {"name": "get_weather"}}
    for stream in (False, True):
        r = client.chat.completions.create(
            model="smol",
            messages=ASK,  # type: ignore[arg-type]
            tools=TOOLS,  # type: ignore[arg-type]
            tool_choice=named,  # type: ignore[arg-type]
            stream=stream,
        )
        if stream:
            deltas = [tc for c in r for tc in (c.choices[0].delta.tool_calls or [])]  # type: ignore[union-attr]
            names = [d.function.name for d in deltas if d.function and d.function.name]
            args = "".join(d.function.arguments or "" for d in deltas if d.function)
            assert names == ["get_weather"] and json.loads(args) == {"city": "Paris"}
            pieces = [d.function.arguments for d in deltas if d.function and d.function.arguments]
            assert len(pieces) > 1  # the arguments stream in fragments
        else:
            (call,) = r.choices[0].message.tool_calls or []  # type: ignore[union-attr]
            assert call.function.name == "get_weather"  # type: ignore[union-attr]
            assert json.loads(call.function.arguments) == {"city": "Paris"}  # type: ignore[union-attr]


def test_chat_bad_choices_are_400(url: str) -> None:
    client = _openai(url)
    unknown = {"type": "function", "function": {"name": "nope"}}
    with pytest.raises(openai.BadRequestError, match="not in tools"):
        client.chat.completions.create(model="smol", messages=ASK, tools=TOOLS, tool_choice=unknown)  # type: ignore[arg-type]
    with pytest.raises(openai.BadRequestError, match="needs tools"):
        client.chat.completions.create(model="smol", messages=ASK, tool_choice="required")  # type: ignore[arg-type]


def test_responses_named_and_required(url: str) -> None:
    client = _openai(url)
    tools = [{"type": "function", **t["function"]} for t in TOOLS]  # type: ignore[dict-item]
    named = client.responses.create(
        model="smol",
        input="Weather in Paris?",
        tools=tools,  # type: ignore[arg-type]
        tool_choice={"type": "function", "name": "get_weather"},
    )
    calls = [o for o in named.output if o.type == "function_call"]
    assert [c.name for c in calls] == ["get_weather"]  # type: ignore[union-attr]
    events = client.responses.create(
        model="smol",
        input="Weather in Paris?",
        tools=tools,  # type: ignore[arg-type]
        tool_choice={"type": "function", "name": "get_weather"},
        stream=True,
    )
    pieces = [e.delta for e in events if e.type == "response.function_call_arguments.delta"]
    assert len(pieces) > 1 and json.loads("".join(pieces)) == {"city": "Paris"}
    required = client.responses.create(
        model="smol",
        input="Weather in Paris?",
        tools=tools,  # type: ignore[arg-type]
        tool_choice="required",
    )
    assert [o.name for o in required.output if o.type == "function_call"] == ["get_time"]  # type: ignore[union-attr]


def test_anthropic_any_and_tool(url: str) -> None:
    client = anthropic.Anthropic(base_url=url, api_key="x", max_retries=0)
    tools = [
        {"name": t["function"]["name"], "input_schema": t["function"]["parameters"]} for t in TOOLS
    ]  # type: ignore[index]
    for choice, name in (
        ({"type": "any"}, "get_time"),
        ({"type": "tool", "name": "get_weather"}, "get_weather"),
    ):
        with client.messages.stream(
            model="smol",
            max_tokens=100,
            tools=tools,  # type: ignore[arg-type]
            tool_choice=choice,  # type: ignore[arg-type]
            messages=ASK,  # type: ignore[arg-type]
        ) as stream:
            kinds = [e.delta.type for e in stream if e.type == "content_block_delta"]
            final = stream.get_final_message()
        assert kinds.count("input_json_delta") > 1  # the input streams in fragments
        assert final.stop_reason == "tool_use"
        assert [(b.type, getattr(b, "name", None)) for b in final.content] == [("tool_use", name)]
        assert final.content[0].input == {"city": "Paris"}  # type: ignore[union-attr]
    with pytest.raises(anthropic.BadRequestError, match="not in tools"):
        client.messages.create(
            model="smol",
            max_tokens=10,
            tools=tools,  # type: ignore[arg-type]
            tool_choice={"type": "tool", "name": "nope"},
            messages=ASK,  # type: ignore[arg-type]
        )


def test_format_that_cannot_force_is_a_clear_400(serve) -> None:  # type: ignore[no-untyped-def]
    with serve() as base:  # the scripted test format has no way to force a call
        client = _openai(base)
        with pytest.raises(openai.BadRequestError, match="'required' is not supported"):
            client.chat.completions.create(
                model="fake-chatml", messages=ASK, tools=TOOLS, tool_choice="required"
            )  # type: ignore[arg-type]
