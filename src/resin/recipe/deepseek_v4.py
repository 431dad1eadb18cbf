"""DeepSeek-V4: `<｜User｜>` / `<｜Assistant｜>` turns, `<think>` reasoning, DSML tool calls.

Written from the model repository's own encoder (`encoding/encoding_dsv4.py` of
deepseek-ai/DeepSeek-V4-Flash; transformers ships none and the checkpoint no chat template), as
this library renders it:

- The prompt opens with `<｜begin▁of▁sentence｜>`. A system turn is its text, no marker; tools
  are listed after the first system turn's text (`\\n\\n## Tools ...`, one JSON schema a line),
  or in an empty one first when the conversation has none.
- User turns are `<｜User｜>` + text. Tool results have no turn of their own: consecutive user
  and tool messages merge into one user turn whose parts (texts, and results as
  `<tool_result>...</tool_result>` in the order of the calls that asked for them) are joined by
  blank lines. A developer turn is a user turn of its own.
- A user turn followed by the assistant (or ending a prompt that asks for a reply) closes with
  `<｜Assistant｜>` and `</think>` (chat) or `<think>` (thinking: the model reasons first).
  Without tools, reasoning before the last user turn is dropped: those turns close with
  `</think>`, their assistant replies carry no reasoning, and developer turns before it are
  left out. With tools every turn keeps its reasoning.
- An assistant turn is (thinking: its reasoning, `</think>`) its text, then its calls as a
  `<｜DSML｜tool_calls>` block of `<｜DSML｜invoke name="...">` elements, one
  `<｜DSML｜parameter name="k" string="true|false">v</｜DSML｜parameter>` line per argument
  (strings as they are, other values as JSON), then `<｜end▁of▁sentence｜>`.

Left out: the encoder's `reasoning_effort` preamble, its internal task tokens and
`latest_reminder` role, and `response_format` (requests have no field for them here).
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from resin.recipe.native import NativeRecipe
from resin.recipe.tagged import TagSpec
from resin.recipe.toolcall_formats import ParsedCall
from resin.recipe.types import Message, Role, ToolCall, ToolDef

BOS, EOS = "<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>"
USER, ASSISTANT = "<｜User｜>", "<｜Assistant｜>"
THINK, END_THINK = "<think>", "</think>"
DSML = "｜DSML｜"
CALLS_OPEN, CALLS_CLOSE = f"<{DSML}tool_calls>", f"</{DSML}tool_calls>"
INVOKE_OPEN, INVOKE_CLOSE = f"<{DSML}invoke", f"</{DSML}invoke>"
PARAMETER_CLOSE = f"</{DSML}parameter>"

# The tools section of the system prompt, as the model was trained to read it.
_TOOLS = (
    "## Tools\n\nYou have access to a set of tools to help answer the user's question. You can "
    f'invoke tools by writing a "{CALLS_OPEN}" block like the following:\n\n{CALLS_OPEN}\n'
    f'{INVOKE_OPEN} name="$TOOL_NAME">\n<{DSML}parameter name="$PARAMETER_NAME" '
    f'string="true|false">$PARAMETER_VALUE{PARAMETER_CLOSE}\n...\n{INVOKE_CLOSE}\n'
    f'{INVOKE_OPEN} name="$TOOL_NAME2">\n...\n{INVOKE_CLOSE}\n{CALLS_CLOSE}\n\n'
    'String parameters should be specified as is and set `string="true"`. For all other types '
    "(numbers, booleans, arrays, objects), pass the value in JSON format and set "
    '`string="false"`.\n\n'
    f"If thinking_mode is enabled (triggered by {THINK}), you MUST output your complete "
    f"reasoning inside {THINK}...{END_THINK} BEFORE any tool calls or final response.\n\n"
    f"Otherwise, output directly after {END_THINK} with tool calls or final response.\n\n"
    "### Available Tool Schemas\n\n{schemas}\n\n"
    "You MUST strictly follow the above defined tool name and parameter schemas to invoke tool "
    "calls.\n"
)


def _json(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False)


def tools_section(tools: Sequence[ToolDef]) -> str:
    schemas = "\n".join(_json(tool.to_openai()["function"]) for tool in tools)
    return _TOOLS.replace("{schemas}", schemas)


def dsml_call(call: ToolCall) -> str:
    """One call as an invoke element; arguments that are not a JSON object are passed as one
    string parameter named `arguments` (as the encoder does)."""
    arguments = call.parsed_arguments()
    if isinstance(arguments, str):
        arguments = {"arguments": arguments}
    if not isinstance(arguments, dict):
        raise ValueError(f"DeepSeek-V4 tool calls take object arguments; {call.name!r} has "
                         f"{arguments!r}")  # fmt: skip
    lines = [
        f'<{DSML}parameter name="{key}" string="{"true" if isinstance(value, str) else "false"}">'
        f"{value if isinstance(value, str) else _json(value)}{PARAMETER_CLOSE}"
        for key, value in arguments.items()
    ]
    body = "\n".join(lines)
    return f'{INVOKE_OPEN} name="{call.name}">\n{body}\n{INVOKE_CLOSE}'


@dataclass
class _Turn:
    """A turn as rendered: `role` "system" / "user" / "developer" / "assistant"."""

    role: str
    parts: list[str] = field(default_factory=list)  # user: texts and results, in order
    result_ids: list[str | None] = field(default_factory=list)  # None for a text part
    message: Message | None = None


def _turns(messages: Sequence[Message], tools: Sequence[ToolDef] | None) -> list[_Turn]:
    turns: list[_Turn] = []
    call_order: dict[str, int] = {}
    for message in messages:
        role = message.role
        if role in (Role.USER, Role.TOOL):
            if not (turns and turns[-1].role == "user"):
                turns.append(_Turn("user"))
            turn = turns[-1]
            if role is Role.USER:
                turn.parts.append(message.text)
                turn.result_ids.append(None)
            else:
                results = [(r.content, r.tool_call_id) for r in message.tool_results]
                for content, call_id in results or [(message.text, "")]:
                    turn.parts.append(f"<tool_result>{content}</tool_result>")
                    turn.result_ids.append(call_id)
            continue
        if turns and turns[-1].role == "user" and call_order:
            _sort_results(turns[-1], call_order)
        if role is Role.ASSISTANT and message.tool_calls:
            call_order = {call.id: i for i, call in enumerate(message.tool_calls) if call.id}
        name = {Role.SYSTEM: "system", Role.DEVELOPER: "developer"}.get(role, "assistant")
        turns.append(_Turn(name, [message.text], message=message))
    if turns and turns[-1].role == "user" and call_order:
        _sort_results(turns[-1], call_order)
    if tools:
        system = next((t for t in turns if t.role == "system"), None)
        if system is None:
            system = _Turn("system", [""])
            turns.insert(0, system)
        system.parts = [system.parts[0] + "\n\n" + tools_section(tools)]
    return turns


def _sort_results(turn: _Turn, order: dict[str, int]) -> None:
    """Results in the order of the calls that asked for them (unknown ids first), the text
    parts where they are."""
    slots = [i for i, call_id in enumerate(turn.result_ids) if call_id is not None]
    ranked = sorted(slots, key=lambda i: order.get(turn.result_ids[i] or "", 0))
    parts = list(turn.parts)
    for slot, source in zip(slots, ranked, strict=True):
        turn.parts[slot] = parts[source]
    turn.result_ids = [None] * len(turn.result_ids)


class DeepSeekV4Recipe(NativeRecipe):
    name = "deepseek_v4"
    stop_tokens = (EOS,)
    supports_reasoning = True

    def render_text(
        self,
        messages: list[Message],
        *,
        tools: list[ToolDef] | None,
        add_generation_prompt: bool,
        enable_thinking: bool | None,
    ) -> str:
        thinking = bool(enable_thinking)
        keep_reasoning = bool(tools)  # the encoder keeps all reasoning once tools are listed
        turns = _turns(messages, tools)
        users = [i for i, t in enumerate(turns) if t.role in ("user", "developer")]
        last_user = users[-1] if users else -1
        if thinking and not keep_reasoning:  # developer turns before the last user turn go
            turns = [t for i, t in enumerate(turns) if t.role != "developer" or i >= last_user]
            users = [i for i, t in enumerate(turns) if t.role in ("user", "developer")]
            last_user = users[-1] if users else -1
        out = [self.token(BOS)]
        for index, turn in enumerate(turns):
            if turn.role == "system":
                out.append(turn.parts[0])
            elif turn.role in ("user", "developer"):
                out.append(self.token(USER) + "\n\n".join(turn.parts))
                last = index + 1 == len(turns)
                before_reply = not last and turns[index + 1].role == "assistant"
                if before_reply or (last and add_generation_prompt):
                    opens = thinking and (keep_reasoning or index >= last_user)
                    out.append(self.token(ASSISTANT) + (THINK if opens else END_THINK))
            else:
                assert turn.message is not None
                kept = thinking and (keep_reasoning or index > last_user)
                out.append(self._assistant(turn.message, kept))
        return "".join(out)

    def _assistant(self, message: Message, with_reasoning: bool) -> str:
        parts = [((message.reasoning or "") + END_THINK) if with_reasoning else "", message.text]
        if message.tool_calls:
            calls = "\n".join(dsml_call(call) for call in message.tool_calls)
            parts.append(f"\n\n{CALLS_OPEN}\n{calls}\n{CALLS_CLOSE}")
        return "".join(parts) + self.token(EOS)

    def parser_spec(self, tools: Sequence[ToolDef] | None) -> TagSpec:
        return TagSpec(
            tool_start=INVOKE_OPEN,
            tool_end=INVOKE_CLOSE,
            tool_body=parse_dsml_invoke,
            ignored=(CALLS_OPEN, CALLS_CLOSE),
        )


_INVOKE_NAME = re.compile(r'\s*name="([^"\n]*)">\n?')
_PARAMETER = re.compile(
    rf'<{DSML}parameter name="([^"]*)" string="(true|false)">(.*?){PARAMETER_CLOSE}\n?', re.S
)


def parse_dsml_invoke(body: str) -> list[ParsedCall]:
    """The inside of one `<｜DSML｜invoke ...>` element (from its ` name="..."` on): a call
    with its parameters as a JSON object (`string="true"` values as text, others as JSON)."""
    head = _INVOKE_NAME.match(body)
    if head is None or not head.group(1).strip():
        raise ValueError("DSML invoke without a name")
    arguments: dict[str, Any] = {}
    position = head.end()
    for match in _PARAMETER.finditer(body, position):
        if body[position : match.start()].strip():
            raise ValueError("text between DSML parameters")
        key, string, value = match.groups()
        if key in arguments:
            raise ValueError(f"DSML parameter {key!r} given twice")
        arguments[key] = value if string == "true" else json.loads(value)
        position = match.end()
    if body[position:].strip():
        raise ValueError("malformed DSML parameters")
    return [(head.group(1), _json(arguments))]
