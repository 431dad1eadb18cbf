"""Llama 3.x (3.1 format): header-delimited turns, JSON tool calls, `ipython` tool results.

Matches Meta's Llama 3.1 Instruct template with its defaults (custom tools listed in the first
user turn, "Today Date: 26 Jul 2024"). The model calls a tool by answering with a bare JSON
object `{"name": ..., "parameters": {...}}` (optionally after `<|python_tag|>`), so with tools
the parser buffers a response that starts with `{` and decides at the end.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

from resin.recipe.native import NativeRecipe
from resin.recipe.tagged import TagSpec
from resin.recipe.types import Message, Role, ToolDef

_TOOL_PROMPT = (
    "Given the following functions, please respond with a JSON for a function call "
    "with its proper arguments that best answers the given prompt.\n\n"
    'Respond in the format {"name": function name, "parameters": dictionary of argument name '
    "and its value}.Do not use variables.\n\n"
)
DATE_STRING = "26 Jul 2024"


class Llama3Recipe(NativeRecipe):
    name = "llama3"
    stop_tokens = ("<|eot_id|>", "<|eom_id|>", "<|end_of_text|>")

    def _header(self, role: str) -> str:
        return f"<|start_header_id|>{role}<|end_header_id|>\n\n"

    def render_text(
        self,
        messages: list[Message],
        *,
        tools: list[ToolDef] | None,
        add_generation_prompt: bool,
        enable_thinking: bool | None,
    ) -> str:
        bos, eot = self.token("<|begin_of_text|>"), self.token("<|eot_id|>")
        out = [bos]
        system = ""
        if messages and messages[0].role in (Role.SYSTEM, Role.DEVELOPER):
            system, messages = messages[0].text.strip(), messages[1:]
        out.append(self._header("system"))
        if tools is not None:
            out.append("Environment: ipython\n")
        out.append(f"Cutting Knowledge Date: December 2023\nToday Date: {DATE_STRING}\n\n")
        out.append(f"{system}{eot}")
        if tools is not None:
            if not messages:
                raise ValueError("llama3: tools need a first user message to go in")
            first, messages = messages[0].text.strip(), messages[1:]
            out.append(self._header("user") + _TOOL_PROMPT)
            out.extend(
                json.dumps(t.to_openai(), ensure_ascii=False, indent=4) + "\n\n" for t in tools
            )
            out.append(f"{first}{eot}")
        for message in messages:
            out.append(self._message(message, eot))
        if add_generation_prompt:
            out.append(self._header("assistant"))
        return "".join(out)

    def _message(self, message: Message, eot: str) -> str:
        if message.role is Role.TOOL:
            results = [r.content for r in message.tool_results] or [message.text]
            # The official template prints a string result through `tojson` (a str is iterable).
            return "".join(
                f"{self._header('ipython')}{json.dumps(r, ensure_ascii=False)}{eot}"
                for r in results
            )
        calls = message.tool_calls
        if calls:
            if len(calls) != 1:
                raise ValueError("llama3 takes one tool call per assistant turn")
            arguments = json.dumps(calls[0].parsed_arguments(), ensure_ascii=False)
            body = f'{{"name": "{calls[0].name}", "parameters": {arguments}}}'
            return f"{self._header('assistant')}{body}{eot}"
        return f"{self._header(message.role.value)}{message.text.strip()}{eot}"

    def parser_spec(self, tools: Sequence[ToolDef] | None) -> TagSpec:
        return TagSpec(
            reasoning_start=None,
            reasoning_end=None,
            tool_start=None,
            tool_end=None,
            bare_json_tools=bool(tools),
        )
