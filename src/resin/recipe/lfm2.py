"""LFM2 (Liquid AI): ChatML-like turns after `<|startoftext|>`, tools listed as JSON between
`<|tool_list_start|>`/`<|tool_list_end|>` in the system turn, calls between
`<|tool_call_start|>`/`<|tool_call_end|>` (Pythonic `[f(a=1)]` by default, JSON accepted),
results wrapped in `<|tool_response_start|>`. Matches the official LFM2 template, which expects
an assistant's tool calls inside its content the way the model wrote them: this recipe writes
`ToolCall` blocks there in LFM2's Pythonic form.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from resin.recipe.native import NativeRecipe
from resin.recipe.tagged import TagSpec
from resin.recipe.toolcall_formats import parse_pythonic_calls
from resin.recipe.types import Message, Role, ToolCall, ToolDef


def pythonic_value(value: Any) -> str:
    """A JSON value as a Python literal (what LFM2 writes inside its calls)."""
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)
    if isinstance(value, bool) or value is None:
        return repr(value)
    if isinstance(value, list):
        return "[" + ", ".join(pythonic_value(v) for v in value) + "]"
    if isinstance(value, dict):
        items = (f"{json.dumps(str(k))}: {pythonic_value(v)}" for k, v in value.items())
        return "{" + ", ".join(items) + "}"
    return json.dumps(value)


def pythonic_calls(calls: Sequence[ToolCall]) -> str:
    """`<|tool_call_start|>[f(a=1), g(b="x")]<|tool_call_end|>` for an assistant's calls."""
    rendered = []
    for call in calls:
        arguments = call.parsed_arguments()
        if not isinstance(arguments, dict):
            raise ValueError(f"lfm2: tool call {call.name!r} arguments must be a JSON object")
        args = ", ".join(f"{k}={pythonic_value(v)}" for k, v in arguments.items())
        rendered.append(f"{call.name}({args})")
    return "<|tool_call_start|>[" + ", ".join(rendered) + "]<|tool_call_end|>"


class LFM2Recipe(NativeRecipe):
    name = "lfm2"
    stop_tokens = ("<|im_end|>", "<|endoftext|>")
    supports_reasoning = True  # LFM2.5 thinking checkpoints use <think>

    def render_text(
        self,
        messages: list[Message],
        *,
        tools: list[ToolDef] | None,
        add_generation_prompt: bool,
        enable_thinking: bool | None,
    ) -> str:
        start, end = self.token("<|im_start|>"), self.token("<|im_end|>")
        out = [self.token("<|startoftext|>")]
        system = ""
        if messages and messages[0].role in (Role.SYSTEM, Role.DEVELOPER):
            system, messages = messages[0].text, messages[1:]
        if tools:
            listed = ", ".join(json.dumps(t.to_openai(), ensure_ascii=False) for t in tools)
            system += ("\n" if system else "") + (
                f"List of tools: <|tool_list_start|>[{listed}]<|tool_list_end|>"
            )
        if system:
            out.append(f"{start}system\n{system}{end}\n")
        for message in messages:
            if message.role is Role.TOOL:
                results = [r.content for r in message.tool_results] or [message.text]
                out.extend(
                    f"{start}tool\n<|tool_response_start|>{r}<|tool_response_end|>{end}\n"
                    for r in results
                )
                continue
            calls = pythonic_calls(message.tool_calls) if message.tool_calls else ""
            out.append(f"{start}{message.role.value}\n{calls}{message.text}{end}\n")
        if add_generation_prompt:
            out.append(f"{start}assistant\n")
        return "".join(out)

    def parser_spec(self, tools: Sequence[ToolDef] | None) -> TagSpec:
        return TagSpec(
            tool_start="<|tool_call_start|>",
            tool_end="<|tool_call_end|>",
            tool_body=parse_pythonic_calls,
        )
