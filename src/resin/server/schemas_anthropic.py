"""Typed request bodies of the Anthropic Messages route (unknown fields tolerated)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from resin.server.schemas_openai import MAX_MESSAGES, MAX_TOOLS, TOOL_NAME, Loose


class Block(Loose):
    """A content block: text | tool_use | tool_result | thinking (others are refused)."""

    type: str
    text: str | None = None
    id: str | None = None
    name: str | None = None
    input: dict[str, Any] | None = None
    tool_use_id: str | None = None
    content: str | list[Block] | None = None
    thinking: str | None = None


class MessageIn(Loose):
    role: Literal["user", "assistant"]
    content: str | list[Block]


class ToolDefIn(Loose):
    name: str = Field(pattern=TOOL_NAME)
    description: str = ""
    input_schema: dict[str, Any] = Field(default_factory=dict)


class ToolChoiceIn(Loose):
    type: Literal["auto", "any", "tool", "none"] = "auto"
    name: str | None = None


class ThinkingIn(Loose):
    type: Literal["enabled", "disabled", "adaptive"] = "disabled"
    budget_tokens: int | None = None


class MessagesRequest(Loose):
    model: str
    messages: list[MessageIn] = Field(min_length=1, max_length=MAX_MESSAGES)
    max_tokens: int = Field(ge=1)
    system: str | list[Block] | None = None
    stop_sequences: list[str] | None = Field(None, max_length=16)
    temperature: float | None = Field(None, ge=0, le=1)
    top_p: float | None = Field(None, gt=0, le=1)
    top_k: int | None = Field(None, ge=0)
    stream: bool = False
    tools: list[ToolDefIn] | None = Field(None, max_length=MAX_TOOLS)
    tool_choice: ToolChoiceIn | None = None
    thinking: ThinkingIn | None = None
    output_format: dict[str, Any] | None = None
    output_config: dict[str, Any] | None = None
    """`{"format": {"type": "json_schema", "schema": ...}}` (current SDKs); other keys: a 400."""


class CountTokensRequest(Loose):
    model: str
    messages: list[MessageIn] = Field(min_length=1, max_length=MAX_MESSAGES)
    system: str | list[Block] | None = None
    tools: list[ToolDefIn] | None = Field(None, max_length=MAX_TOOLS)
    tool_choice: ToolChoiceIn | None = None
    thinking: ThinkingIn | None = None
