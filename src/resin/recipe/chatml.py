"""ChatML and Qwen3: `<|im_start|>role\\n...<|im_end|>` turns, Hermes-style tools.

Tools are listed as JSON inside `<tools></tools>` in the system turn; the model calls them with
`<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>`; results come back in a user turn
as `<tool_response>` blocks. Qwen3 adds `<think>` reasoning: rendered for assistant turns after
the last real user query, and `enable_thinking=False` pre-fills an empty think block. The text
matches Qwen3's official template (`chatml` is the same without the reasoning logic).
"""

from __future__ import annotations

import json
from collections.abc import Sequence

from resin.recipe.native import NativeRecipe
from resin.recipe.tagged import TagSpec
from resin.recipe.types import Message, Role, ToolDef, canonical_json

_TOOLS_HEADER = (
    "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>"
)
_TOOLS_FOOTER = (
    "\n</tools>\n\nFor each function call, return a json object with function name and "
    "arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n"
    '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>'
)


def tool_json(tool: ToolDef) -> str:
    return json.dumps(tool.to_openai(), ensure_ascii=False)


def split_think(content: str) -> tuple[str, str]:
    """(reasoning, content) from an assistant text that embeds `<think>...</think>`."""
    if "</think>" not in content:
        return "", content
    tail = content.split("</think>")[-1]
    reasoning = content.split("</think>")[0].rstrip("\n").split("<think>")[-1].lstrip("\n")
    return reasoning, tail.lstrip("\n")


def _is_tool_response(text: str) -> bool:
    return text.startswith("<tool_response>") and text.endswith("</tool_response>")


class ChatMLRecipe(NativeRecipe):
    name = "chatml"
    stop_tokens = ("<|im_end|>", "<|endoftext|>")
    supports_reasoning = False
    thinking = False

    def render_text(
        self,
        messages: list[Message],
        *,
        tools: list[ToolDef] | None,
        add_generation_prompt: bool,
        enable_thinking: bool | None,
    ) -> str:
        start, end = self.token("<|im_start|>"), self.token("<|im_end|>")
        out: list[str] = []
        system_first = bool(messages) and messages[0].role in (Role.SYSTEM, Role.DEVELOPER)
        if tools:
            out.append(f"{start}system\n")
            if system_first:
                out.append(messages[0].text + "\n\n")
            out.append(_TOOLS_HEADER)
            out.extend("\n" + tool_json(t) for t in tools)
            out.append(f"{_TOOLS_FOOTER}{end}\n")
        elif system_first:
            out.append(f"{start}system\n{messages[0].text}{end}\n")
        last_query = self._last_query_index(messages)
        for index, message in enumerate(messages):
            role = message.role
            if role is Role.USER or (role in (Role.SYSTEM, Role.DEVELOPER) and index > 0):
                out.append(f"{start}{role.value}\n{message.text}{end}\n")
            elif role is Role.ASSISTANT:
                out.append(self._assistant(message, index, last_query, index == len(messages) - 1))
                out.append(f"{end}\n")
            elif role is Role.TOOL:
                previous_tool = index > 0 and messages[index - 1].role is Role.TOOL
                next_tool = index + 1 < len(messages) and messages[index + 1].role is Role.TOOL
                if not previous_tool:
                    out.append(f"{start}user")
                for result in _tool_texts(message):
                    out.append(f"\n<tool_response>\n{result}\n</tool_response>")
                if not next_tool:
                    out.append(f"{end}\n")
        if add_generation_prompt:
            out.append(f"{start}assistant\n")
            if self.thinking and enable_thinking is False:
                out.append("<think>\n\n</think>\n\n")
        return "".join(out)

    @staticmethod
    def _last_query_index(messages: Sequence[Message]) -> int:
        for index in range(len(messages) - 1, -1, -1):
            message = messages[index]
            if message.role is Role.USER and not _is_tool_response(message.text):
                return index
        return len(messages) - 1

    def _assistant(self, message: Message, index: int, last_query: int, is_last: bool) -> str:
        content = message.text
        reasoning = message.reasoning
        if reasoning is None:
            reasoning, content = split_think(content) if self.thinking else ("", content)
        parts = ["<|im_start|>assistant\n"]
        if self.thinking and index > last_query and (is_last or reasoning):
            parts.append(
                f"<think>\n{reasoning.strip(chr(10))}\n</think>\n\n{content.lstrip(chr(10))}"
            )
        else:
            parts.append(content)
        for number, call in enumerate(message.tool_calls):
            if number > 0 or content:
                parts.append("\n")
            parts.append(
                f'<tool_call>\n{{"name": "{call.name}", "arguments": '
                f"{canonical_json(call.arguments)}}}\n</tool_call>"
            )
        return "".join(parts)

    def parser_spec(self, tools: Sequence[ToolDef] | None) -> TagSpec:
        if self.thinking:
            return TagSpec()
        return TagSpec(reasoning_start=None, reasoning_end=None)


def _tool_texts(message: Message) -> list[str]:
    results = [r.content for r in message.tool_results]
    return results or [message.text]


class Qwen3Recipe(ChatMLRecipe):
    name = "qwen3"
    supports_reasoning = True
    thinking = True
