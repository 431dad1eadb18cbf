"""The `Recipe` and `ResponseParser` protocols; application recipes implement the same two.

A recipe turns a conversation into prompt token ids (`render`) and gives, per request, a parser
that turns generated token ids back into typed deltas (`create_parser`). Invariants:
- `render(...).token_ids` are exactly what the model sees; `.text` decodes to them.
- A parser never raises on model output: malformed pieces become text plus `ParseResult.error`.
- Feeding the same output whole, token by token or in any split gives the same `ParseResult`
  totals (text, reasoning, tool calls, finish reason).
- Stop tokens (`stop_token_ids`) are consumed by the parser and produce no text; ids after a
  stop token are ignored.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, runtime_checkable

from resin.recipe.deltas import Delta, ParseResult
from resin.recipe.tool_choice import AutoCalls, ForcedStructure, ToolChoice
from resin.recipe.types import Message, ToolDef


@dataclass(frozen=True)
class RenderedPrompt:
    """A rendered conversation. `multimodal` holds one `resin.plan.MediaItem` per image for
    vision recipes (placeholder span in `token_ids`, content hash, preprocessed tensor; what
    `Engine.submit(media=...)` takes); empty for text-only prompts."""

    token_ids: list[int]
    text: str
    multimodal: tuple[Any, ...] = field(default=())
    # The forced start of the assistant turn (`resin.recipe.tool_choice`); `text` ends with it.
    forced_prefix: str = ""
    # What may follow the forced prefix (tool name and arguments schema), for a grammar.
    forced_structures: tuple[ForcedStructure, ...] = ()
    # Tools without a forced choice (auto): how a call looks inside free text, for a grammar.
    auto_calls: AutoCalls | None = None
    # The start of the assistant's answer the prompt already holds: a continued final message
    # (`resin.recipe.prefill`); `text` ends with it and the parser is primed with it.
    prefill: str = ""

    @property
    def head(self) -> str:
        """`text` without the prefill: the prompt as far as the generation prompt."""
        return self.text[: len(self.text) - len(self.prefill)]

    @property
    def primed(self) -> str:
        """What the parser consumes before the model's first token (prefill or forced prefix)."""
        return self.prefill + self.forced_prefix


@runtime_checkable
class ResponseParser(Protocol):
    def feed(self, token_ids: Sequence[int]) -> list[Delta]:
        """Consume generated ids; return the deltas that are now complete."""
        ...

    def feed_text(self, text: str) -> list[Delta]:
        """Consume generated text (no stop tokens in it); return the deltas now complete."""
        ...

    def finish(self, reason: Literal["stop", "length"] = "stop") -> ParseResult:
        """Flush what is held back and report the totals; the parser is spent afterwards."""
        ...


@runtime_checkable
class Recipe(Protocol):
    name: str
    stop_token_ids: tuple[int, ...]
    supports_tools: bool
    supports_reasoning: bool
    supports_images: bool

    def render(
        self,
        messages: Sequence[Message],
        *,
        tools: Sequence[ToolDef] | None = None,
        add_generation_prompt: bool = True,
        enable_thinking: bool | None = None,
        tool_choice: ToolChoice | None = None,
        continue_final_message: bool = False,
    ) -> RenderedPrompt:
        """`tool_choice` forces a tool call (see `resin.recipe.tool_choice`); a recipe that
        cannot force it raises `UnsupportedToolChoice`. `continue_final_message` continues
        the last (assistant) message instead of opening a new turn (`resin.recipe.prefill`);
        it excludes a forced `tool_choice`."""
        ...

    def create_parser(
        self, prompt: RenderedPrompt, *, tools: Sequence[ToolDef] | None = None
    ) -> ResponseParser: ...
