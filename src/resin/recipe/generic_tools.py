"""Tools for a chat template that has no tool section: a Hermes-style system block.

Many small checkpoints (SmolLM2 among them) ship a template that ignores `tools`. Dropping the
tools silently would leave the model guessing, so a `JinjaRecipe` whose family parses
`<tool_call>{json}</tool_call>` (ChatML, Qwen, Gemma, generic templates) states the tools in
the system message instead, and tells the model how to call them in exactly the format its
parser reads. Families with another call format refuse tools with a clear error.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

from resin.recipe.types import Message, Role, Text, ToolDef

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
