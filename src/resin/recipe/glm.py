"""GLM-4.5 / GLM-4.5-Air: `[gMASK]<sop>`, then `<|system|>` / `<|user|>` / `<|assistant|>` /
`<|observation|>` turns, `<think>` reasoning and XML-style tool calls:
`<tool_call>name\\n<arg_key>k</arg_key>\\n<arg_value>v</arg_value>\\n</tool_call>`.

Matches GLM-4.5's official template: tools are listed as JSON in a leading system turn, every
assistant turn opens with a think block (its reasoning kept only after the last user turn,
else empty), string argument values are printed raw and others as JSON, tool results follow
one `<|observation|>` as `<tool_response>` blocks. `enable_thinking=False` appends `/nothink`
to each user turn and pre-fills an empty think block; the model answers after a newline.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from functools import partial

from resin.recipe.chatml import split_think, tool_json
from resin.recipe.native import NativeRecipe
from resin.recipe.tagged import TagSpec
from resin.recipe.toolcall_formats import parse_glm_call
from resin.recipe.types import Message, Role, ToolCall, ToolDef

_TOOLS_HEADER = (
    "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n"
)
_TOOLS_FOOTER = (
    "</tools>\n\nFor each function call, output the function name and arguments within the "
    "following XML format:\n<tool_call>{function-name}\n<arg_key>{arg-key-1}</arg_key>\n"
    "<arg_value>{arg-value-1}</arg_value>\n<arg_key>{arg-key-2}</arg_key>\n"
    "<arg_value>{arg-value-2}</arg_value>\n...\n</tool_call>"
)


def glm_tool_call(call: ToolCall) -> str:
    """One call as the template prints it (arguments must be a JSON object)."""
    arguments = call.parsed_arguments()
    if not isinstance(arguments, dict):
        raise ValueError(f"GLM tool calls need object arguments; {call.name!r} has {arguments!r}")
    pairs = "".join(
        f"<arg_key>{key}</arg_key>\n<arg_value>"
        f"{value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)}"
        "</arg_value>\n"
        for key, value in arguments.items()
    )
    return f"\n<tool_call>{call.name}\n{pairs}</tool_call>"


def string_parameters(tools: Sequence[ToolDef] | None) -> dict[str, frozenset[str]]:
    """Per tool, the parameters its schema types as strings (kept as text when parsed)."""
    out = {}
    for tool in tools or ():
        properties = dict(tool.parameters).get("properties") or {}
        out[tool.name] = frozenset(
            key for key, schema in properties.items() if dict(schema).get("type") == "string"
        )
    return out


class Glm45Recipe(NativeRecipe):
    name = "glm4_moe"
    stop_tokens = ("<|endoftext|>", "<|user|>", "<|observation|>")
    supports_reasoning = True

    def render_text(
        self,
        messages: list[Message],
        *,
        tools: list[ToolDef] | None,
        add_generation_prompt: bool,
        enable_thinking: bool | None,
    ) -> str:
        out = [self.token("[gMASK]") + self.token("<sop>")]
        if tools:
            listed = "".join(tool_json(t) + "\n" for t in tools)
            out.append(f"{self.token('<|system|>')}\n{_TOOLS_HEADER}{listed}{_TOOLS_FOOTER}")
        users = [i for i, m in enumerate(messages) if m.role is Role.USER]
        last_user = users[-1] if users else -1
        for index, message in enumerate(messages):
            role = message.role
            if role is Role.USER:
                text = message.text
                no_think = enable_thinking is False and not text.endswith("/nothink")
                out.append(f"{self.token('<|user|>')}\n{text}{'/nothink' if no_think else ''}")
            elif role is Role.ASSISTANT:
                out.append(self._assistant(message, index > last_user))
            elif role is Role.TOOL:
                if index == 0 or messages[index - 1].role is not Role.TOOL:
                    out.append(self.token("<|observation|>"))
                results = [r.content for r in message.tool_results] or [message.text]
                out.extend(f"\n<tool_response>\n{r}\n</tool_response>" for r in results)
            else:  # system, developer
                out.append(f"{self.token('<|system|>')}\n{message.text}")
        if add_generation_prompt:
            out.append(self.token("<|assistant|>"))
            if enable_thinking is False:
                out.append("\n<think></think>")
        return "".join(out)

    def _assistant(self, message: Message, after_last_user: bool) -> str:
        content, reasoning = message.text, message.reasoning
        if reasoning is None:
            reasoning, content = split_think(content)
        parts = [self.token("<|assistant|>")]
        if after_last_user and reasoning:
            parts.append(f"\n<think>{reasoning.strip()}</think>")
        else:
            parts.append("\n<think></think>")
        if content.strip():
            parts.append("\n" + content.strip())
        parts.extend(glm_tool_call(call) for call in message.tool_calls)
        return "".join(parts)

    def parser_spec(self, tools: Sequence[ToolDef] | None) -> TagSpec:
        return TagSpec(
            tool_body=partial(parse_glm_call, string_keys=string_parameters(tools)),
            strip_leading_newlines=True,
        )
