"""What the server needs from the engine, the tokenizer and the chat recipe, as Protocols.

The server is written against these small contracts so it runs unchanged on the real
`resin.Engine` + a recipe from `resin.recipe`, or on the zero-cost fakes in
`resin.server.testing`. Parsers emit `resin.recipe`'s delta types.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

from resin.events import Event
from resin.params import SamplingParams
from resin.recipe.deltas import (
    Delta,
    ReasoningDelta,
    TextDelta,
    ToolCallArgsDelta,
    ToolCallEnd,
    ToolCallStart,
)
from resin.recipe.protocol import RenderedPrompt
from resin.recipe.tool_choice import ToolChoice

__all__ = [
    "ChatFormat",
    "ChatTurn",
    "Delta",
    "EngineLike",
    "OutputParser",
    "ReasoningDelta",
    "RenderedPrompt",
    "RequestHandle",
    "TextDelta",
    "TokenizerLike",
    "ToolCallArgsDelta",
    "ToolCallEnd",
    "ToolCallItem",
    "ToolCallStart",
    "ToolSpec",
]


class RequestHandle(Protocol):
    """The part of `resin.Request` the server reads."""

    @property
    def id(self) -> int: ...


class EngineLike(Protocol):
    """A synchronous engine driven by exactly one thread (the server's actor)."""

    @property
    def context_length(self) -> int: ...

    @property
    def num_waiting(self) -> int: ...

    @property
    def num_running(self) -> int: ...

    def submit(
        self, prompt_token_ids: Sequence[int], sampling_params: SamplingParams | None = None
    ) -> RequestHandle: ...

    def step(self) -> list[Event]: ...

    def abort(self, request: Any) -> None: ...

    def has_work(self) -> bool: ...

    def close(self) -> None: ...


class TokenizerLike(Protocol):
    """Text <-> token ids (the part of `resin.tokenizer.Tokenizer` the server uses)."""

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]: ...

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = False) -> str: ...

    @property
    def vocab_size(self) -> int: ...

    @property
    def eos_token_ids(self) -> tuple[int, ...]: ...


@dataclass(frozen=True, slots=True)
class ToolSpec:
    """A function the model may call: JSON-schema `parameters`."""

    name: str
    description: str = ""
    parameters: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class ToolCallItem:
    """A finished tool call in a conversation (`arguments` is a JSON string)."""

    id: str
    name: str
    arguments: str


@dataclass(frozen=True, slots=True)
class ChatTurn:
    """One message of a conversation, in the server's normalized form."""

    role: Literal["system", "user", "assistant", "tool"]
    content: str = ""
    reasoning: str = ""
    tool_calls: tuple[ToolCallItem, ...] = ()
    tool_call_id: str = ""


class OutputParser(Protocol):
    """Turns generated token ids into typed deltas, incrementally. `finish` flushes."""

    def feed(self, token_ids: Sequence[int]) -> list[Delta]: ...

    def finish(self) -> list[Delta]: ...


class ChatFormat(Protocol):
    """Renders a conversation to prompt ids and parses the model's answer."""

    @property
    def stop_token_ids(self) -> tuple[int, ...]: ...

    @property
    def supports_tools(self) -> bool: ...

    @property
    def supports_reasoning(self) -> bool: ...

    def render(
        self,
        turns: Sequence[ChatTurn],
        tools: Sequence[ToolSpec] = (),
        enable_thinking: bool | None = None,
        tool_choice: ToolChoice | None = None,
    ) -> RenderedPrompt:
        """`tool_choice` forces a tool call; a format that cannot force it raises
        `resin.recipe.UnsupportedToolChoice`."""
        ...

    def create_parser(
        self, prompt: RenderedPrompt, tools: Sequence[ToolSpec] = ()
    ) -> OutputParser: ...
