"""gpt-oss ("harmony"): messages `<|start|>{role}<|channel|>{channel}<|message|>...<|end|>`.

Rendering follows the official gpt-oss template (system message with the current date and
reasoning effort, a developer message with instructions and tools as a TypeScript namespace,
earlier reasoning dropped except before a pending tool call). Unlike the template, which keeps
only the first call of an assistant turn, every call is rendered as its own message, and a
tool result is addressed from the call it answers (matched by id).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import datetime

from resin.recipe.harmony_parser import HarmonyParser
from resin.recipe.harmony_tools import tool_namespace
from resin.recipe.native import NativeRecipe
from resin.recipe.protocol import RenderedPrompt, ResponseParser
from resin.recipe.tagged import TagSpec
from resin.recipe.tool_choice import AutoCalls, ToolChoice, unsupported
from resin.recipe.types import Message, Role, ToolDef
from resin.tokenizer import Tokenizer

MODEL_IDENTITY = "You are ChatGPT, a large language model trained by OpenAI."
_MARKERS = ("<|channel|>analysis<|message|>", "<|channel|>final<|message|>")


class GptOssRecipe(NativeRecipe):
    name = "gpt_oss"
    stop_tokens = ("<|return|>", "<|call|>")
    supports_reasoning = True

    def __init__(self, tokenizer: Tokenizer, reasoning_effort: str = "medium") -> None:
        super().__init__(tokenizer)
        if reasoning_effort not in ("low", "medium", "high"):
            raise ValueError(f"reasoning_effort must be low, medium or high: {reasoning_effort!r}")
        self.reasoning_effort = reasoning_effort

    def _system(self, tools: list[ToolDef] | None) -> str:
        today = datetime.now().strftime("%Y-%m-%d")
        text = (
            f"{MODEL_IDENTITY}\nKnowledge cutoff: 2024-06\nCurrent date: {today}\n\n"
            f"Reasoning: {self.reasoning_effort}\n\n"
            "# Valid channels: analysis, commentary, final. Channel must be included for every "
            "message."
        )
        if tools:
            text += "\nCalls to these tools must go to the commentary channel: 'functions'."
        return f"<|start|>system<|message|>{text}<|end|>"

    def render_text(
        self,
        messages: list[Message],
        *,
        tools: list[ToolDef] | None,
        add_generation_prompt: bool,
        enable_thinking: bool | None,
    ) -> str:
        for token in ("<|start|>", "<|message|>", "<|channel|>", "<|end|>"):
            self.token(token)
        out = [self._system(tools)]
        developer = ""
        if messages and messages[0].role in (Role.SYSTEM, Role.DEVELOPER):
            developer, messages = messages[0].text, messages[1:]
        if developer or tools:
            out.append("<|start|>developer<|message|>")
            if developer:
                out.append(f"# Instructions\n\n{developer}\n\n")
            if tools:
                out.append("# Tools\n\n" + tool_namespace(tools))
            out.append("<|end|>")
        call_names: dict[str, str] = {}
        last_call: str | None = None
        for index, message in enumerate(messages):
            if message.role is Role.ASSISTANT:
                content, thinking = message.text, message.reasoning
                if any(m in content or m in (thinking or "") for m in _MARKERS):
                    raise ValueError("gpt_oss: pass reasoning as a Reasoning block, not channels")
                if message.tool_calls:
                    later_final = any(
                        m.role is Role.ASSISTANT and not m.tool_calls for m in messages[index + 1 :]
                    )
                    if content and thinking:
                        raise ValueError("gpt_oss: a tool-call turn takes content or reasoning")
                    analysis = content or thinking
                    if analysis and not later_final:
                        out.append(
                            f"<|start|>assistant<|channel|>analysis<|message|>{analysis}<|end|>"
                        )
                    for call in message.tool_calls:
                        arguments = json.dumps(call.parsed_arguments(), ensure_ascii=False)
                        out.append(
                            f"<|start|>assistant to=functions.{call.name}<|channel|>commentary "
                            f"json<|message|>{arguments}<|call|>"
                        )
                        call_names[call.id] = last_call = call.name
                elif index == len(messages) - 1 and not add_generation_prompt:
                    if thinking is not None:
                        out.append(
                            f"<|start|>assistant<|channel|>analysis<|message|>{thinking}<|end|>"
                        )
                    out.append(f"<|start|>assistant<|channel|>final<|message|>{content}<|return|>")
                else:
                    out.append(f"<|start|>assistant<|channel|>final<|message|>{content}<|end|>")
                    last_call = None
            elif message.role is Role.TOOL:
                results = message.tool_results or ()
                pairs = [
                    (call_names.get(r.tool_call_id, r.name or last_call), r.content)
                    for r in results
                ]
                if not results:
                    pairs = [(last_call, message.text)]
                for name, text in pairs:
                    if name is None:
                        raise ValueError("gpt_oss: a tool result needs an earlier tool call")
                    body = json.dumps(text, ensure_ascii=False)
                    out.append(
                        f"<|start|>functions.{name} to=assistant<|channel|>commentary<|message|>"
                        f"{body}<|end|>"
                    )
            elif message.role is Role.USER:
                out.append(f"<|start|>user<|message|>{message.text}<|end|>")
        if add_generation_prompt:
            out.append("<|start|>assistant")
        return "".join(out)

    def parser_spec(self, tools: Sequence[ToolDef] | None) -> TagSpec:
        raise NotImplementedError("gpt_oss uses the harmony parser")

    def tool_choice_prefix(self, choice: ToolChoice, tools: list[ToolDef]) -> str:
        # The model may first reason on the analysis channel; forcing the commentary channel
        # needs a harmony-aware parser priming that is not written yet.
        raise unsupported(choice)

    def auto_calls(self, tools: list[ToolDef]) -> AutoCalls | None:
        return None  # harmony calls are messages on a channel: the output path checks them

    def starts_in_reasoning(self, prompt: RenderedPrompt) -> bool:
        return False

    def create_parser(
        self, prompt: RenderedPrompt, *, tools: Sequence[ToolDef] | None = None
    ) -> ResponseParser:
        harmony = HarmonyParser(self.tokenizer, self.stop_token_ids)
        harmony.prime(prompt.prefill)
        return harmony
