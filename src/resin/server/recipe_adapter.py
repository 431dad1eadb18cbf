"""`RecipeChatFormat`: a `resin.recipe` Recipe seen through the server's `ChatFormat`.

Converts the server's normalized turns and tool specs into recipe `Message`s and `ToolDef`s,
and wraps the recipe's parser so `finish()` returns the flushed deltas.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from resin.recipe import (
    Message,
    Reasoning,
    Recipe,
    ResponseParser,
    Text,
    ToolCall,
    ToolDef,
    ToolResult,
    get_native_recipe,
)
from resin.recipe.types import Block
from resin.server.ports import ChatTurn, Delta, RenderedPrompt, ToolSpec
from resin.tokenizer import Tokenizer


def to_messages(turns: Sequence[ChatTurn]) -> list[Message]:
    out = []
    for t in turns:
        blocks: list[Block] = []
        if t.role == "tool":
            blocks.append(ToolResult(t.tool_call_id, t.content))
        else:
            if t.reasoning:
                blocks.append(Reasoning(t.reasoning))
            if t.content:
                blocks.append(Text(t.content))
            blocks.extend(ToolCall(c.id, c.name, c.arguments) for c in t.tool_calls)
        out.append(Message(t.role, blocks))
    return out


def to_tool_defs(tools: Sequence[ToolSpec]) -> list[ToolDef]:
    return [ToolDef(t.name, t.description or None, t.parameters) for t in tools]


class _Parser:
    def __init__(self, parser: ResponseParser) -> None:
        self._parser = parser

    def feed(self, token_ids: Sequence[int]) -> list[Delta]:
        return self._parser.feed(token_ids)

    def finish(self) -> list[Delta]:
        return list(self._parser.finish("stop").deltas)


class RecipeChatFormat:
    def __init__(self, recipe: Recipe) -> None:
        self.recipe = recipe

    @classmethod
    def load(cls, tokenizer: Tokenizer, name: str | None = None) -> RecipeChatFormat:
        """The named native recipe, or one detected from the vocabulary; LookupError if none
        fits (the caller then falls back to the checkpoint's own template)."""
        import resin.recipe as recipes

        finder: Any = getattr(recipes, "load_recipe", None)
        if finder is not None:
            return cls(finder(tokenizer, name))
        if name is None:
            name = detect_native(tokenizer)
        return cls(get_native_recipe(name, tokenizer))

    @property
    def stop_token_ids(self) -> tuple[int, ...]:
        return tuple(self.recipe.stop_token_ids)

    @property
    def supports_tools(self) -> bool:
        return bool(self.recipe.supports_tools)

    @property
    def supports_reasoning(self) -> bool:
        return bool(self.recipe.supports_reasoning)

    def render(
        self,
        turns: Sequence[ChatTurn],
        tools: Sequence[ToolSpec] = (),
        enable_thinking: bool | None = None,
    ) -> RenderedPrompt:
        return self.recipe.render(
            to_messages(turns),
            tools=to_tool_defs(tools) or None,
            enable_thinking=enable_thinking,
        )

    def create_parser(self, prompt: RenderedPrompt, tools: Sequence[ToolSpec] = ()) -> _Parser:
        return _Parser(self.recipe.create_parser(prompt, tools=to_tool_defs(tools) or None))


def detect_native(tokenizer: Tokenizer) -> str:
    """A native recipe whose special tokens this tokenizer has and whose reasoning/tool
    syntax the checkpoint's template uses; plain ChatML models keep their own template."""

    def has(token: str) -> bool:
        return tokenizer.token_to_id(token) is not None

    template = tokenizer.chat_template or ""
    if has("<|start_header_id|>") and has("<|eot_id|>"):
        return "llama3"
    if has("<|im_start|>") and has("<think>") and "<think>" in template:
        return "qwen3"
    if has("<|im_start|>") and "<tool_call>" in template:
        return "chatml"
    raise LookupError("no native recipe detected")
