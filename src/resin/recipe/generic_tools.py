"""Tools for a chat template that has no tool section: a Hermes-style system block.

Many small checkpoints (SmolLM2 among them) ship a template that ignores `tools`. Dropping the
tools silently would leave the model guessing, so a `JinjaRecipe` whose family parses
`<tool_call>{json}</tool_call>` (ChatML, Qwen, Gemma, generic templates) states the tools in
the system message instead, and tells the model how to call them in exactly the format its
parser reads. Families with another call format refuse tools with a clear error.

Such a template drops the history's tool traffic as well (it renders `content` only), so the
earlier calls are written back as the `<tool_call>` text the model produced, and tool results
go in a user turn as `<tool_response>` blocks (the Hermes / Qwen 2.5 layout): without that the
model sees results of calls it never made.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

from resin.recipe.types import Message, Role, Text, ToolCall, ToolDef

_INSTRUCTIONS = (
    "You may call functions to answer. Their signatures, as JSON schemas:\n"
    "<tools>\n{tools}\n</tools>\n"
    "To call a function, reply with a JSON object naming it and giving its arguments, "
    "inside <tool_call></tool_call> tags:\n"
    '<tool_call>\n{{"name": "<function name>", "arguments": {{<arguments>}}}}\n</tool_call>'
)


def tool_prompt(tools: Sequence[ToolDef]) -> str:
    lines = "\n".join(json.dumps(tool.to_openai(), ensure_ascii=False) for tool in tools)
    return _INSTRUCTIONS.format(tools=lines)


def with_tool_prompt(messages: Sequence[Message], tools: Sequence[ToolDef]) -> list[Message]:
    """`messages` with the tool block appended to the system message (one is added first
    when the conversation has none)."""
    block = tool_prompt(tools)
    out = list(messages)
    if out and out[0].role is Role.SYSTEM:
        out[0] = Message(Role.SYSTEM, (*out[0].content, Text("\n\n" + block)))
    else:
        out.insert(0, Message(Role.SYSTEM, block))
    return out


def tool_history_as_text(messages: Sequence[Message]) -> list[Message]:
    """`messages` with each assistant call as `<tool_call>` text and each run of tool results
    as one user turn of `<tool_response>` blocks (unchanged when there is no tool traffic)."""
    out: list[Message] = []
    for m in messages:
        if m.role is Role.TOOL:
            results = [r.content for r in m.tool_results] or [m.text]
            text = "\n".join(f"<tool_response>\n{r}\n</tool_response>" for r in results)
            last = out[-1] if out else None
            if (
                last is not None
                and last.role is Role.USER
                and last.text.endswith("</tool_response>")
            ):
                out[-1] = Message(Role.USER, (*last.content, Text("\n" + text)))
            else:
                out.append(Message(Role.USER, text))
        elif m.role is Role.ASSISTANT and m.tool_calls:
            blocks = [b for b in m.content if not isinstance(b, ToolCall)]
            calls = "\n".join(_call_text(c) for c in m.tool_calls)
            out.append(Message(Role.ASSISTANT, (*blocks, Text(("\n" if m.text else "") + calls))))
        else:
            out.append(m)
    return out


def _call_text(call: ToolCall) -> str:
    body = {"name": call.name, "arguments": call.parsed_arguments()}
    return f"<tool_call>\n{json.dumps(body, ensure_ascii=False)}\n</tool_call>"
