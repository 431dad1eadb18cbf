"""Typed conversation objects: messages, content blocks and tool definitions.

A `Message` holds an ordered list of content blocks. Invariants:
- `Message.content` is always a tuple of blocks (a `str` given to the constructor becomes one
  `Text` block; an empty string becomes no block at all).
- `ToolCall.arguments` is JSON text (what the model wrote or the client sent), never a dict, so
  that a malformed argument string survives a round trip unchanged.
- Blocks are frozen; a conversation can be shared between threads and requests.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, TypeAlias

import numpy as np


class Role(StrEnum):
    """Who speaks. `DEVELOPER` is the OpenAI name for a system message; recipes treat the two
    alike unless their format distinguishes them (gpt-oss does)."""

    SYSTEM = "system"
    DEVELOPER = "developer"
    USER = "user"
    ASSISTANT = "assistant"
    TOOL = "tool"


@dataclass(frozen=True)
class Text:
    text: str


@dataclass(frozen=True)
class Reasoning:
    """The model's chain of thought of an earlier assistant turn (OpenAI `reasoning_content`)."""

    text: str


@dataclass(frozen=True, eq=False)
class Image:
    """An image as an HxWx3 uint8 RGB array (`pixels`), or an undecoded payload (`data`: the
    bytes of a PNG/JPEG file) or a URL the server resolves before rendering. Recipes that take
    images need `pixels` (or `data`, decoded with Pillow when installed)."""

    pixels: np.ndarray[Any, np.dtype[np.uint8]] | None = None
    data: bytes | None = None
    url: str | None = None

    def __post_init__(self) -> None:
        if self.pixels is None and self.data is None and self.url is None:
            raise ValueError("Image needs pixels, data or url")
        if self.pixels is not None and (self.pixels.ndim != 3 or self.pixels.shape[2] != 3):
            raise ValueError(f"Image.pixels must be HxWx3 RGB, got shape {self.pixels.shape}")


@dataclass(frozen=True)
class ToolCall:
    """One call the assistant made. `arguments` is JSON text (an object when well formed)."""

    id: str
    name: str
    arguments: str

    def parsed_arguments(self) -> Any:
        """The arguments as a Python value; the raw text when it is not valid JSON."""
        try:
            return json.loads(self.arguments)
        except ValueError:
            return self.arguments


@dataclass(frozen=True)
class ToolResult:
    """The result of a tool call, sent back with role TOOL."""

    tool_call_id: str
    content: str
    name: str | None = None


Block: TypeAlias = Text | Image | ToolCall | ToolResult | Reasoning


@dataclass(frozen=True)
class Message:
    """One turn of a conversation. Accepts `content` as a str or an iterable of blocks."""

    role: Role
    content: tuple[Block, ...] = field(default=())

    def __init__(self, role: Role | str, content: str | Iterable[Block] = ()) -> None:
        object.__setattr__(self, "role", Role(role))
        if isinstance(content, str):
            blocks: tuple[Block, ...] = (Text(content),) if content else ()
        else:
            blocks = tuple(content)
        for block in blocks:
            if not isinstance(block, Text | Image | ToolCall | ToolResult | Reasoning):
                raise TypeError(f"unknown content block {type(block).__name__}")
        object.__setattr__(self, "content", blocks)

    @property
    def text(self) -> str:
        """The concatenated `Text` blocks."""
        return "".join(b.text for b in self.content if isinstance(b, Text))

    @property
    def reasoning(self) -> str | None:
        parts = [b.text for b in self.content if isinstance(b, Reasoning)]
        return "".join(parts) if parts else None

    @property
    def tool_calls(self) -> tuple[ToolCall, ...]:
        return tuple(b for b in self.content if isinstance(b, ToolCall))

    @property
    def tool_results(self) -> tuple[ToolResult, ...]:
        return tuple(b for b in self.content if isinstance(b, ToolResult))

    @property
    def images(self) -> tuple[Image, ...]:
        return tuple(b for b in self.content if isinstance(b, Image))


@dataclass(frozen=True)
class ToolDef:
    """A function the model may call; `parameters` is a JSON Schema object."""

    name: str
    description: str | None = None
    parameters: Mapping[str, Any] = field(default_factory=dict)

    def to_openai(self) -> dict[str, Any]:
        """The OpenAI/HF form `{"type": "function", "function": {...}}` chat templates expect."""
        function: dict[str, Any] = {"name": self.name}
        if self.description is not None:
            function["description"] = self.description
        function["parameters"] = dict(self.parameters)
        return {"type": "function", "function": function}


def canonical_json(arguments: str) -> str:
    """Re-serialize JSON text the way HF templates' `tojson` does (`json.dumps`, ensure_ascii
    off); text that is not valid JSON is returned unchanged."""
    try:
        value = json.loads(arguments)
    except ValueError:
        return arguments
    return json.dumps(value, ensure_ascii=False)
