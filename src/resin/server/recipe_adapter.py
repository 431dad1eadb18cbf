"""`RecipeChatFormat`: a `resin.recipe` Recipe seen through the server's `ChatFormat`.

Converts the server's normalized turns and tool specs into recipe `Message`s and `ToolDef`s,
and wraps the recipe's parser so `finish()` returns the flushed deltas.
"""

from __future__ import annotations

from collections.abc import Sequence

from resin.recipe import (
    Message,
    Reasoning,
    Recipe,
    ResponseParser,
    Text,
    ToolCall,
    ToolDef,
    ToolResult,
)
from resin.recipe.tool_choice import ToolChoice
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
        """The named recipe, or `resin.recipe.load_recipe`'s choice; a detected native recipe
        that renders a system-less conversation differently from the checkpoint's template
        (SmolLM2's template adds a default system prompt) gives way to the template."""
        from resin.recipe.jinja_recipe import JinjaRecipe, load_recipe

        recipe = load_recipe(tokenizer, name)
        if name is None and tokenizer.chat_template and not isinstance(recipe, JinjaRecipe):
            template = JinjaRecipe(tokenizer)
            probe = [Message("user", "Hi")]
            if recipe.render(probe).text != template.render(probe).text:
                recipe = template
        return cls(recipe)

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
        tool_choice: ToolChoice | None = None,
    ) -> RenderedPrompt:
        if tool_choice is None:  # recipes written before tool_choice existed keep working
            return self.recipe.render(
                to_messages(turns),
                tools=to_tool_defs(tools) or None,
                enable_thinking=enable_thinking,
            )
        return self.recipe.render(
            to_messages(turns),
            tools=to_tool_defs(tools) or None,
            enable_thinking=enable_thinking,
            tool_choice=tool_choice,
        )

    def create_parser(self, prompt: RenderedPrompt, tools: Sequence[ToolSpec] = ()) -> _Parser:
        return _Parser(self.recipe.create_parser(prompt, tools=to_tool_defs(tools) or None))
