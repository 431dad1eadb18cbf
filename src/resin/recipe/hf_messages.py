"""Resin messages -> the dict form Hugging Face chat templates take.

`{"role", "content"}` plus `tool_calls` (`{"id", "type": "function", "function": {"name",
"arguments"}}`), the reasoning under the key the family's template reads, and one dict per
tool result (`{"role": "tool", "tool_call_id", "content"}`). Arguments go in as a dict (what
templates that `tojson` them expect) unless `string_arguments` (templates that concatenate).
Images become `{"type": "image"}` items of a list content, in order with the text.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from resin.recipe.types import Image, Message, Role, Text, ToolDef


def to_hf_messages(
    messages: Sequence[Message],
    *,
    string_arguments: bool = False,
    reasoning_key: str = "reasoning_content",
) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for message in messages:
        if message.role is Role.TOOL:
            results = message.tool_results
            if not results:
                out.append({"role": "tool", "content": message.text})
            for result in results:
                entry: dict[str, Any] = {
                    "role": "tool",
                    "tool_call_id": result.tool_call_id,
                    "content": result.content,
                }
                if result.name is not None:
                    entry["name"] = result.name
                out.append(entry)
            continue
        entry = {"role": message.role.value, "content": _content(message)}
        if message.reasoning is not None:
            entry[reasoning_key] = message.reasoning
        if message.tool_calls:
            entry["tool_calls"] = [
                {
                    "id": call.id,
                    "type": "function",
                    "function": {
                        "name": call.name,
                        "arguments": call.arguments
                        if string_arguments
                        else call.parsed_arguments(),
                    },
                }
                for call in message.tool_calls
            ]
        out.append(entry)
    return out


def _content(message: Message) -> str | list[dict[str, Any]]:
    if not message.images:
        return message.text
    items: list[dict[str, Any]] = []
    for block in message.content:
        if isinstance(block, Image):
            items.append({"type": "image"})
        elif isinstance(block, Text):
            items.append({"type": "text", "text": block.text})
    return items


def to_hf_tools(tools: Sequence[ToolDef] | None) -> list[dict[str, Any]] | None:
    return None if not tools else [tool.to_openai() for tool in tools]
