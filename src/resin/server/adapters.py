"""Chat formats for real tokenizers.

`TemplateChatFormat` renders with the checkpoint's own Jinja chat template (Hugging Face
style) and treats the whole answer as text: the fallback when no native recipe applies.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from resin.recipe.tool_choice import ToolChoice, unsupported
from resin.server.ports import ChatTurn, OutputParser, RenderedPrompt, ToolSpec
from resin.server.text import PlainTextParser
from resin.tokenizer import Tokenizer


class TemplateChatFormat:
    """Render with `tokenizer.chat_template`; stop on the tokenizer's EOS / end-of-turn ids."""

    supports_reasoning = False

    def __init__(self, tokenizer: Tokenizer) -> None:
        import jinja2.sandbox

        if not tokenizer.chat_template:
            raise ValueError("the tokenizer has no chat template")
        env = jinja2.sandbox.ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
        env.globals["raise_exception"] = _raise
        env.filters["tojson"] = lambda v, indent=None: json.dumps(v, indent=indent)
        self._template = env.from_string(tokenizer.chat_template)
        self.tokenizer = tokenizer
        self.supports_tools = "tools" in tokenizer.chat_template
        stops = list(tokenizer.eos_token_ids)
        for name in ("<|im_end|>", "<|eot_id|>", "<|end|>", "<end_of_turn>"):
            tid = tokenizer.token_to_id(name)
            if tid is not None and tid not in stops:
                stops.append(tid)
        self._stops = tuple(stops)

    @property
    def stop_token_ids(self) -> tuple[int, ...]:
        return self._stops

    def render(
        self,
        turns: Sequence[ChatTurn],
        tools: Sequence[ToolSpec] = (),
        enable_thinking: bool | None = None,
        tool_choice: ToolChoice | None = None,
    ) -> RenderedPrompt:
        if tool_choice is not None:
            raise unsupported(tool_choice)
        messages: list[dict[str, Any]] = []
        for t in turns:
            m: dict[str, Any] = {"role": t.role, "content": t.content}
            if t.tool_calls:
                m["tool_calls"] = [
                    {
                        "id": c.id,
                        "type": "function",
                        "function": {"name": c.name, "arguments": json.loads(c.arguments or "{}")},
                    }
                    for c in t.tool_calls
                ]
            if t.tool_call_id:
                m["tool_call_id"] = t.tool_call_id
            messages.append(m)
        kwargs: dict[str, Any] = {}
        if tools:
            kwargs["tools"] = [
                {
                    "type": "function",
                    "function": {
                        "name": s.name,
                        "description": s.description,
                        "parameters": s.parameters,
                    },
                }
                for s in tools
            ]
        if enable_thinking is not None:
            kwargs["enable_thinking"] = enable_thinking
        info = self.tokenizer.info
        text = self._template.render(
            messages=messages,
            add_generation_prompt=True,
            bos_token=info.bos_token or "",
            eos_token=info.eos_token or "",
            **kwargs,
        )
        return RenderedPrompt(self.tokenizer.encode(text, add_special_tokens=False), text)

    def create_parser(self, prompt: RenderedPrompt, tools: Sequence[ToolSpec] = ()) -> OutputParser:
        return PlainTextParser(self.tokenizer, self._stops)


def _raise(message: str) -> None:
    raise ValueError(message)
