"""`tool_choice` of the three APIs -> a `resin.recipe.ToolChoice` (or None for auto / none).

OpenAI chat: "required" or `{"type": "function", "function": {"name": X}}`; Responses: the same
or `{"type": "function", "name": X}`; Anthropic: `{"type": "any"}` or `{"type": "tool",
"name": X}`. A forced choice without tools, or naming a tool that is not in `tools`, is a 400;
the recipe then forces the call by a prompt prefix (`resin.recipe.tool_choice`), and a chat
format that cannot is a 400 from `Service.render`, never a silent `auto`. `KnownTools` keeps
calls to tools the request did not offer out of every answer.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from dataclasses import replace
from typing import Any, Literal

from resin.frontend.ports import OutputParser
from resin.recipe.deltas import (
    Delta,
    ParseResult,
    TextDelta,
    ToolCallArgsDelta,
    ToolCallEnd,
    ToolCallStart,
    merge_deltas,
)
from resin.recipe.tool_choice import ToolChoice
from resin.recipe.types import ToolDef
from resin.server.errors import ApiError

log = logging.getLogger("resin.server")


def checked(choice: ToolChoice | None, tools: Sequence[ToolDef]) -> ToolChoice | None:
    """`choice`, after checking it against the request's tools (400 on a mismatch)."""
    if choice is None:
        return None
    if not tools:
        raise ApiError(400, f"tool_choice {choice.label} needs tools", "tool_choice")
    if choice.name is not None and choice.name not in {t.name for t in tools}:
        raise ApiError(400, f"tool_choice names {choice.name!r}, not in tools", "tool_choice")
    return choice


def openai_choice(value: Any, tools: Sequence[ToolDef]) -> ToolChoice | None:
    """Chat Completions and Responses shapes (a pydantic model or a plain dict)."""
    if value is None or value in ("auto", "none"):
        return None
    if value == "required":
        return checked(ToolChoice(), tools)
    if not isinstance(value, dict):
        value = value.model_dump() if hasattr(value, "model_dump") else {}
    function = value.get("function")
    name = function.get("name") if isinstance(function, dict) else value.get("name")
    if value.get("type") != "function" or not isinstance(name, str) or not name:
        raise ApiError(400, "tool_choice must be auto, none, required or a function", "tool_choice")
    return checked(ToolChoice(name), tools)


def anthropic_choice(
    kind: str | None, name: str | None, tools: Sequence[ToolDef]
) -> ToolChoice | None:
    if kind == "any":
        return checked(ToolChoice(), tools)
    if kind == "tool":
        if not name:
            raise ApiError(400, "tool_choice of type 'tool' needs a name", "tool_choice")
        return checked(ToolChoice(name), tools)
    return None


class KnownTools:
    """The output path's guard (every API, streamed or not): a tool call whose name is not
    among the request's tools is never returned as a call. Its deltas are held back and,
    when the call ends, come out as content text, the JSON `{"name": ..., "arguments": ...}`
    with the arguments as the model wrote them; the calls that remain are numbered from 0
    again. One warning per request goes to the `resin.server` log. With a grammar on the
    request (forced or auto tool choice) this never triggers; it covers what a grammar does
    not (a response format beside tools, a prefill, a format with no grammar description,
    a recipe's own parser)."""

    def __init__(self, parser: OutputParser, tools: Sequence[ToolDef]) -> None:
        self._parser = parser
        self._names = frozenset(t.name for t in tools)
        self._refused: dict[int, tuple[str, list[str]]] = {}  # parser index -> name, args
        self._index: dict[int, int] = {}  # parser index -> the index the client sees
        self._text: list[str] = []
        self._warned = False

    def feed(self, token_ids: Sequence[int]) -> list[Delta]:
        return self._filter(self._parser.feed(token_ids))

    def finish(self, reason: Literal["stop", "length"] = "stop") -> ParseResult:
        result = self._parser.finish(reason)
        deltas = self._filter(list(result.deltas))
        for index in list(self._refused):  # a call the parser never ended
            deltas.append(self._as_text(index))
        calls = tuple(c for c in result.tool_calls if c.name in self._names)
        finish_reason = result.finish_reason
        if finish_reason == "tool_calls" and not calls:
            finish_reason = "stop"
        error = result.error
        if self._warned:
            error = "; ".join(filter(None, [error, "a call to an unknown tool returned as text"]))
        return replace(
            result,
            deltas=tuple(merge_deltas(deltas)),
            finish_reason=finish_reason,
            text="".join(self._text),
            tool_calls=calls,
            error=error,
        )

    def _filter(self, deltas: list[Delta]) -> list[Delta]:
        out: list[Delta] = []
        for d in deltas:
            if isinstance(d, ToolCallStart):
                if d.name in self._names:
                    self._index[d.index] = len(self._index)
                    out.append(replace(d, index=self._index[d.index]))
                    continue
                self._refused[d.index] = (d.name, [])
                if not self._warned:
                    self._warned = True
                    log.warning("tool call to %r, which is not in tools, returned as text", d.name)
            elif isinstance(d, ToolCallArgsDelta | ToolCallEnd) and d.index in self._refused:
                if isinstance(d, ToolCallArgsDelta):
                    self._refused[d.index][1].append(d.fragment)
                else:
                    out.append(self._as_text(d.index))
            elif isinstance(d, ToolCallArgsDelta | ToolCallEnd):
                out.append(replace(d, index=self._index.get(d.index, d.index)))
            else:
                if isinstance(d, TextDelta):
                    self._text.append(d.text)
                out.append(d)
        return out

    def _as_text(self, index: int) -> TextDelta:
        name, fragments = self._refused.pop(index)
        arguments = "".join(fragments).strip() or "{}"
        text = f'{{"name": {json.dumps(name, ensure_ascii=False)}, "arguments": {arguments}}}'
        self._text.append(text)
        return TextDelta(text)
