"""What a response parser yields: typed deltas while streaming, a `ParseResult` at the end.

Invariants: concatenating the `TextDelta`s gives `ParseResult.text`, the `ReasoningDelta`s give
`ParseResult.reasoning`; every `ToolCallStart(index)` is followed by zero or more
`ToolCallArgsDelta(index)` whose fragments concatenate to that call's arguments, then by one
`ToolCallEnd(index)`; indices count up from 0 without gaps.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal, TypeAlias

from resin.recipe.types import ToolCall

FinishReason: TypeAlias = Literal["stop", "length", "tool_calls"]


@dataclass(frozen=True)
class TextDelta:
    text: str


@dataclass(frozen=True)
class ReasoningDelta:
    text: str


@dataclass(frozen=True)
class ToolCallStart:
    index: int
    id: str
    name: str


@dataclass(frozen=True)
class ToolCallArgsDelta:
    index: int
    fragment: str


@dataclass(frozen=True)
class ToolCallEnd:
    index: int


Delta: TypeAlias = TextDelta | ReasoningDelta | ToolCallStart | ToolCallArgsDelta | ToolCallEnd


@dataclass(frozen=True)
class ParseResult:
    """The end of a response: the deltas flushed by `finish` and the totals of the whole stream.

    `finish_reason` is "tool_calls" when the response made at least one tool call and stopped
    normally; "length" wins over "tool_calls" when the token budget ran out. `error` describes a
    malformed piece (e.g. bad tool-call JSON) that was reported as text instead.
    """

    deltas: tuple[Delta, ...]
    finish_reason: FinishReason
    text: str
    reasoning: str
    tool_calls: tuple[ToolCall, ...] = field(default=())
    error: str | None = None


def merge_deltas(deltas: list[Delta]) -> list[Delta]:
    """Join neighbouring text/reasoning/argument deltas of the same kind (fewer, larger events)."""
    merged: list[Delta] = []
    for delta in deltas:
        last = merged[-1] if merged else None
        if isinstance(delta, TextDelta) and isinstance(last, TextDelta):
            merged[-1] = TextDelta(last.text + delta.text)
        elif isinstance(delta, ReasoningDelta) and isinstance(last, ReasoningDelta):
            merged[-1] = ReasoningDelta(last.text + delta.text)
        elif (
            isinstance(delta, ToolCallArgsDelta)
            and isinstance(last, ToolCallArgsDelta)
            and last.index == delta.index
        ):
            merged[-1] = ToolCallArgsDelta(delta.index, last.fragment + delta.fragment)
        else:
            merged.append(delta)
    return [d for d in merged if not (isinstance(d, TextDelta | ReasoningDelta) and not d.text)]
