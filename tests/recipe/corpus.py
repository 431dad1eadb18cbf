"""The render corpus: conversations in the Hugging Face message form (what transformers' users
write), and a converter to resin `Message`s written independently of the library's own."""

from __future__ import annotations

import copy
import json
from dataclasses import dataclass, field
from typing import Any

from resin.recipe import Message, Reasoning, Text, ToolCall, ToolDef, ToolResult

WEATHER = ToolDef(
    name="get_weather",
    description="Get the current weather in a city",
    parameters={
        "type": "object",
        "properties": {
            "city": {"type": "string", "description": "The city name"},
            "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
        },
        "required": ["city"],
    },
)
SEARCH = ToolDef(
    name="search",
    description="Search the web",
    parameters={
        "type": "object",
        "properties": {
            "query": {"type": "string"},
            "limit": {"type": "integer", "description": "How many results"},
        },
        "required": ["query"],
    },
)
TOOLS = [WEATHER, SEARCH]


def _call(call_id: str, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


@dataclass(frozen=True)
class Case:
    name: str
    messages: list[dict[str, Any]]
    tools: list[ToolDef] | None = None
    add_generation_prompt: bool = True
    parallel_calls: bool = False  # more than one call in one assistant turn
    tags: frozenset[str] = field(default_factory=frozenset)


CASES = [
    Case("single_user", [{"role": "user", "content": "Hello!"}]),
    Case(
        "system_multi_turn",
        [
            {"role": "system", "content": "You are a terse assistant."},
            {"role": "user", "content": "What is 2+2?"},
            {"role": "assistant", "content": "4."},
            {"role": "user", "content": "And 3+3?"},
        ],
    ),
    Case(
        "unicode",
        [
            {"role": "system", "content": "Réponds en français 🇫🇷."},
            {"role": "user", "content": "你好！Что это? 😀 naïve café"},
        ],
    ),
    Case(
        "history_ends_with_assistant",
        [
            {"role": "user", "content": "Say hi."},
            {"role": "assistant", "content": "Hi!"},
        ],
        add_generation_prompt=False,
    ),
    Case(
        "reasoning_history",
        [
            {"role": "user", "content": "Is 17 prime?"},
            {"role": "assistant", "content": "Yes.", "reasoning_content": "17 has no divisors."},
            {"role": "user", "content": "And 21?"},
        ],
        tags=frozenset({"reasoning"}),
    ),
    Case(
        "reasoning_last_turn",
        [
            {"role": "user", "content": "Is 9 prime?"},
            {"role": "assistant", "content": "No.", "reasoning_content": "9 = 3 * 3."},
        ],
        add_generation_prompt=False,
        tags=frozenset({"reasoning"}),
    ),
    Case("tools_first_turn", [{"role": "user", "content": "Weather in Paris?"}], tools=TOOLS),
    Case(
        "tools_system_first_turn",
        [
            {"role": "system", "content": "You help with travel."},
            {"role": "user", "content": "Weather in Paris?"},
        ],
        tools=TOOLS,
    ),
    Case(
        "tool_call_and_result",
        [
            {"role": "system", "content": "You help with travel."},
            {"role": "user", "content": "Weather in Paris?"},
            {
                "role": "assistant",
                "content": "",
                "tool_calls": [_call("call_1", "get_weather", {"city": "Paris"})],
            },
            {"role": "tool", "tool_call_id": "call_1", "content": '{"temp": 21, "sky": "sunny"}'},
        ],
        tools=TOOLS,
    ),
    Case(
        "tool_round_trip_then_user",
        [
            {"role": "user", "content": "Weather in Zürich?"},
            {
                "role": "assistant",
                "content": "",
                "tool_calls": [
                    _call("call_7", "get_weather", {"city": "Zürich", "unit": "celsius"})
                ],
            },
            {"role": "tool", "tool_call_id": "call_7", "content": "12 degrees, rain"},
            {"role": "assistant", "content": "It is 12 °C and raining in Zürich."},
            {"role": "user", "content": "Thanks! Search for umbrellas."},
        ],
        tools=TOOLS,
    ),
    Case(
        "parallel_tool_calls",
        [
            {"role": "user", "content": "Weather in Paris and Rome?"},
            {
                "role": "assistant",
                "content": "Checking both.",
                "tool_calls": [
                    _call("call_a", "get_weather", {"city": "Paris"}),
                    _call("call_b", "get_weather", {"city": "Rome"}),
                ],
            },
            {"role": "tool", "tool_call_id": "call_a", "content": "sunny"},
            {"role": "tool", "tool_call_id": "call_b", "content": "cloudy"},
        ],
        tools=TOOLS,
        parallel_calls=True,
    ),
]


def to_resin(messages: list[dict[str, Any]]) -> list[Message]:
    out: list[Message] = []
    for m in messages:
        blocks: list[Any] = []
        if m.get("reasoning_content"):
            blocks.append(Reasoning(m["reasoning_content"]))
        if m["role"] == "tool":
            blocks.append(ToolResult(m.get("tool_call_id", ""), m["content"]))
        elif m.get("content"):
            blocks.append(Text(m["content"]))
        for call in m.get("tool_calls", []):
            fn = call["function"]
            args = fn["arguments"]
            text = args if isinstance(args, str) else json.dumps(args, ensure_ascii=False)
            blocks.append(ToolCall(call.get("id", ""), fn["name"], text))
        out.append(Message(m["role"], blocks))
    return out


def with_string_arguments(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Tool-call arguments as JSON text (the OpenAI wire form some templates concatenate)."""
    messages = copy.deepcopy(messages)
    for m in messages:
        for call in m.get("tool_calls", []):
            args = call["function"]["arguments"]
            if not isinstance(args, str):
                call["function"]["arguments"] = json.dumps(args, ensure_ascii=False)
    return messages


def hf_tools(tools: list[ToolDef] | None) -> list[dict[str, Any]] | None:
    return None if tools is None else [t.to_openai() for t in tools]
