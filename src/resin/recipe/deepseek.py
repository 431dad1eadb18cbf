"""DeepSeek V3 (V3.1 hybrid-thinking format): `<｜User｜>`/`<｜Assistant｜>` turns, R1-style
`<think>` reasoning, tool calls between `<｜tool▁call▁begin｜>` markers.

Matches DeepSeek-V3.1's official template: system messages are joined at the top, the
generation prompt ends with `<think>` (thinking on) or `</think>` (off, the default), earlier
reasoning is dropped from the history, and after a tool output the model continues without a
new assistant header. Tool-call arguments are printed as given (JSON text).
"""

from __future__ import annotations

from collections.abc import Sequence

from resin.recipe.native import NativeRecipe
from resin.recipe.tagged import TagSpec
from resin.recipe.toolcall_formats import DEEPSEEK_SEP, parse_deepseek_call
from resin.recipe.types import Message, Role, ToolDef

CALLS_BEGIN, CALLS_END = "<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>"
CALL_BEGIN, CALL_END = "<｜tool▁call▁begin｜>", "<｜tool▁call▁end｜>"
EOS = "<｜end▁of▁sentence｜>"


class DeepSeekV3Recipe(NativeRecipe):
    name = "deepseek_v3"
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
        user, assistant = self.token("<｜User｜>"), self.token("<｜Assistant｜>")
        systems = [m.text for m in messages if m.role in (Role.SYSTEM, Role.DEVELOPER)]
        out = [self.token("<｜begin▁of▁sentence｜>"), "\n\n".join(systems)]
        last_user = is_tool = False
        for message in messages:
            if message.role is Role.USER:
                last_user, is_tool = True, False
                out.append(user + message.text)
            elif message.role is Role.ASSISTANT and message.tool_calls:
                if last_user:
                    out.append(f"{assistant}</think>")
                last_user = is_tool = False
                for number, call in enumerate(message.tool_calls):
                    prefix = (message.text + CALLS_BEGIN) if number == 0 else ""
                    out.append(f"{prefix}{CALL_BEGIN}{call.name}{DEEPSEEK_SEP}{call.arguments}")
                    out.append(CALL_END)
                out.append(CALLS_END + EOS)
            elif message.role is Role.ASSISTANT:
                if last_user:
                    out.append(f"{assistant}</think>")
                last_user = False
                content = message.text
                if not is_tool and "</think>" in content:
                    content = content.split("</think>", 1)[1]
                is_tool = False
                out.append(content + EOS)
            elif message.role is Role.TOOL:
                last_user, is_tool = False, True
                results = [r.content for r in message.tool_results] or [message.text]
                out.extend(f"<｜tool▁output▁begin｜>{r}<｜tool▁output▁end｜>" for r in results)
        if add_generation_prompt and last_user and not is_tool:
            out.append(assistant + ("<think>" if thinking else "</think>"))
        return "".join(out)

    def parser_spec(self, tools: Sequence[ToolDef] | None) -> TagSpec:
        return TagSpec(
            tool_start=CALL_BEGIN,
            tool_end=CALL_END,
            tool_body=parse_deepseek_call,
            ignored=(CALLS_BEGIN, CALLS_END),
        )
