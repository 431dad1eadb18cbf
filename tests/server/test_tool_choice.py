"""`tool_choice` is enforced: a real tokenizer (SmolLM2's) and the real chatml recipe behind the
server, the scripted engine continuing whatever the prompt forces. The scripted model answers
plain text unless the prompt ends inside a tool call, so a call only appears when forced, or
when asked "Which tool?": then it calls a tool nobody offered (the scripted engine ignores
grammars, as a recipe without a grammar description would), which must come back as text."""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from typing import Any

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
UNKNOWN = 'Sure. <tool_call>\n{"name": "Paris", "arguments": {"x": 1}}\n</tool_call>'
KNOWN = f'<tool_call>\n{{"name": "get_time", "arguments": {ARGS}}}\n</tool_call>'
AS_TEXT = 'Sure. {"name": "Paris", "arguments": {"x": 1}}'


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
        if text.endswith('"arguments": '):  # named: the model writes the arguments
            out = f"{ARGS}}}\n</tool_call>"
        elif text.endswith("<tool_call>\n"):  # required: the model picks a tool
            out = f'{{"name": "get_time", "arguments": {ARGS}}}\n</tool_call>'
        elif "Which tool?" in text:  # auto: a call to a tool nobody offered, then a real one
            out = UNKNOWN + ("" if "only" in text else f"\n{KNOWN}")
        else:
            out = "Let me think about that."
        return [*tok.encode(out), end]

    # Paced like a real engine (a token per 10 ms), so a reader keeps up and the streamed
    # arguments arrive in several deltas instead of one coalesced batch.
    engine = FakeEngine(respond, vocab_size=tok.vocab_size, context_length=2048, step_delay=0.01)
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


def test_responses_tool_parameters_must_be_an_object(url: str) -> None:
    bad = [{"type": "function", "name": "f", "parameters": [1, 2]}]
    with pytest.raises(openai.BadRequestError) as info:
        _openai(url).responses.create(model="smol", input="hi", tools=bad)  # type: ignore[arg-type]
    assert isinstance(info.value.body, dict) and info.value.body["param"] == "tools.0.parameters"


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


@pytest.mark.parametrize("only", [False, True])
def test_calls_to_tools_not_offered_come_back_as_text(url: str, only: bool) -> None:
    """Every API, streamed and not: the unknown call is content text, the real one (if any)
    stays a call numbered from 0, and the finish reason follows what is left."""
    ask = [{"role": "user", "content": "Which tool?" + (" only" if only else "")}]
    calls = [] if only else [("get_time", {"city": "Paris"})]
    client = _openai(url)
    for stream in (False, True):
        r = client.chat.completions.create(
            model="smol",
            messages=ask,
            tools=TOOLS,
            stream=stream,  # type: ignore[arg-type]
        )
        if stream:
            chunks = list(r)
            text = "".join(c.choices[0].delta.content or "" for c in chunks)
            deltas = [tc for c in chunks for tc in (c.choices[0].delta.tool_calls or [])]
            got = [(d.index, d.function.name) for d in deltas if d.function and d.function.name]
            assert got == [(0, n) for n, _ in calls]
            finish = chunks[-1].choices[0].finish_reason
        else:
            message = r.choices[0].message  # type: ignore[union-attr]
            text = message.content or ""
            got = [
                (c.function.name, json.loads(c.function.arguments))
                for c in message.tool_calls or []
            ]
            assert got == calls
            finish = r.choices[0].finish_reason  # type: ignore[union-attr]
        assert text.strip() == AS_TEXT and finish == ("stop" if only else "tool_calls")
    tools = [{"type": "function", **t["function"]} for t in TOOLS]  # type: ignore[dict-item]
    responses = client.responses.create(model="smol", input=ask, tools=tools)  # type: ignore[arg-type]
    assert responses.output_text.strip() == AS_TEXT
    assert [
        (o.name, json.loads(o.arguments)) for o in responses.output if o.type == "function_call"
    ] == calls  # type: ignore[union-attr]
    events = list(client.responses.create(model="smol", input=ask, tools=tools, stream=True))  # type: ignore[arg-type]
    done = [
        e.item.name
        for e in events
        if e.type == "response.output_item.done" and e.item.type == "function_call"
    ]  # type: ignore[union-attr]
    assert done == [n for n, _ in calls]
    claude = anthropic.Anthropic(base_url=url, api_key="x", max_retries=0)
    atools = [
        {"name": t["function"]["name"], "input_schema": t["function"]["parameters"]} for t in TOOLS
    ]  # type: ignore[index]
    message = claude.messages.create(model="smol", max_tokens=100, tools=atools, messages=ask)  # type: ignore[arg-type]
    with claude.messages.stream(model="smol", max_tokens=100, tools=atools, messages=ask) as s:  # type: ignore[arg-type]
        streamed = s.get_final_message()
    for m in (message, streamed):
        assert "".join(b.text for b in m.content if b.type == "text").strip() == AS_TEXT
        assert [(b.name, b.input) for b in m.content if b.type == "tool_use"] == calls
        assert m.stop_reason == ("end_turn" if only else "tool_use")


class MaskRecorder:
    """`ZeroCostRunner` (always "a") that counts the steps whose plan carries a token mask."""

    def __init__(self, vocab_size: int, token_id: int) -> None:
        from resin_app.loading import ZeroCostRunner

        self.inner = ZeroCostRunner(vocab_size, token_id)
        self.runner_config = self.inner.runner_config
        self.masked = 0

    def forward(self, plan: Any) -> Any:
        self.masked += plan.sampling.token_bitmask is not None
        return self.inner.forward(plan)


@pytest.mark.parametrize("with_grammar", [True, False])
def test_auto_tools_carry_a_grammar_and_plain_requests_none(with_grammar: bool) -> None:
    """The real engine: a request with tools (auto) is constrained when the engine has a
    grammar backend, and still served without one; a request without tools never is."""
    from resin import Engine, GrammarBackend
    from resin.recipe import get_native_recipe
    from resin.tokenizer import Tokenizer

    default_model = pytest.importorskip("resin_model.default_model")
    tok = Tokenizer.from_dir(default_model.default_model_dir())
    runner = MaskRecorder(tok.vocab_size, tok.encode("a")[0])
    grammar = GrammarBackend.from_tokenizer(tok) if with_grammar else None
    engine = Engine(runner, grammar=grammar)
    recipe = get_native_recipe("chatml", tok)
    server = HttpServer(engine, recipe, tokenizer=tok, model="smol", port=free_port())
    with running(server) as base:
        client = _openai(base)
        plain = client.chat.completions.create(model="smol", messages=ASK, max_tokens=4)  # type: ignore[arg-type]
        assert plain.choices[0].message.content == "aaaa" and runner.masked == 0
        tools = client.chat.completions.create(
            model="smol",
            messages=ASK,
            tools=TOOLS,
            max_tokens=4,  # type: ignore[arg-type]
        )
        assert tools.choices[0].message.content == "aaaa"
    assert (runner.masked > 0) == with_grammar
