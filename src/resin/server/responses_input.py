"""The request side of POST /v1/responses: the body schema, its input items as `Message`s,
and its function tools."""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Annotated, Any

from pydantic import Field, StringConstraints

from resin.recipe.types import Message, ToolCall, ToolDef, ToolResult
from resin.server.errors import ApiError
from resin.server.schemas_openai import MAX_MESSAGES, MAX_TOOLS, TOOL_NAME, Loose
from resin.server.text import call_arguments

Key = Annotated[str, StringConstraints(max_length=64)]
Value = Annotated[str, StringConstraints(max_length=512)]


class ResponsesRequest(Loose):
    model: str | None = None
    input: str | Annotated[list[dict[str, Any]], Field(max_length=MAX_MESSAGES)]
    instructions: str | None = None
    max_output_tokens: int | None = Field(None, ge=1)
    temperature: float | None = Field(None, ge=0, le=2)
    top_p: float | None = Field(None, gt=0, le=1)
    stream: bool = False
    tools: list[dict[str, Any]] | None = Field(None, max_length=MAX_TOOLS)
    tool_choice: str | dict[str, Any] | None = None
    reasoning: dict[str, Any] | None = None
    metadata: dict[Key, Value] | None = Field(None, max_length=16)  # OpenAI's limits
    text: dict[str, Any] | None = None
    previous_response_id: str | None = None
    store: bool | None = None


def _text(content: Any, where: str) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for part in content:
            if not isinstance(part, dict):
                raise ApiError(400, "content parts must be objects", where)
            kind = part.get("type", "input_text")
            if kind not in ("input_text", "output_text", "text"):
                raise ApiError(400, f"content part type {kind!r} is not supported here", where)
            if not isinstance(part.get("text"), str):
                raise ApiError(400, f"a {kind!r} content part needs a string 'text'", where)
            parts.append(part["text"])
        return "".join(parts)
    raise ApiError(400, "content must be a string or a list of text parts", where)


def input_items(value: str | list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A Responses `input` as a list of items (a string is one user message)."""
    if isinstance(value, str):
        return [{"type": "message", "role": "user", "content": value}]
    return list(value)


_ID_PREFIX = {"message": "msg", "function_call": "fc", "function_call_output": "fco"}


def listed_items(items: Sequence[dict[str, Any]], response_id: str) -> list[dict[str, Any]]:
    """Stored input items as `GET /v1/responses/{id}/input_items` lists them: each with an
    `id` (its own, else one derived from the response id and its place, stable across calls)
    and a message's string content as one `input_text` (`output_text` for the assistant)
    part."""
    out = []
    tail = response_id.removeprefix("resp_")
    for i, item in enumerate(items):
        entry = {"type": "message", **item}
        kind = str(entry["type"])
        entry.setdefault("id", f"{_ID_PREFIX.get(kind, 'item')}_{tail}_{i}")
        if kind == "message" and isinstance(entry.get("content"), str):
            part = "output_text" if entry.get("role") == "assistant" else "input_text"
            entry["content"] = [{"type": part, "text": entry["content"]}]
        if kind in _ID_PREFIX:
            entry.setdefault("status", "completed")
        out.append(entry)
    return out


def to_messages(body: ResponsesRequest) -> list[Message]:
    messages = [Message("system", body.instructions)] if body.instructions else []
    for i, item in enumerate(input_items(body.input)):
        kind = item.get("type", "message")
        where = f"input.{i}"
        if kind == "message" and item.get("role") in ("user", "assistant", "system", "developer"):
            role = "system" if item["role"] == "developer" else item["role"]
            messages.append(Message(role, _text(item.get("content", ""), where)))
        elif kind == "function_call":
            arguments = item.get("arguments", "{}")
            if not isinstance(arguments, str):
                raise ApiError(400, "arguments must be a string of JSON", f"{where}.arguments")
            call = ToolCall(
                str(item.get("call_id", "")),
                str(item.get("name", "")),
                call_arguments(arguments, where),
            )
            messages.append(Message("assistant", [call]))
        elif kind == "function_call_output":
            result = ToolResult(str(item.get("call_id", "")), _text(item.get("output", ""), where))
            messages.append(Message("tool", [result]))
        elif kind == "message":
            roles = "user, assistant, system, developer"
            raise ApiError(400, f"role {item.get('role')!r} is not supported ({roles})", where)
        elif kind != "reasoning":
            raise ApiError(400, f"input item type {kind!r} is not supported", where)
    return messages


def tools_of(body: ResponsesRequest) -> list[ToolDef]:
    if not body.tools or body.tool_choice == "none":
        return []
    specs = []
    for i, t in enumerate(body.tools):
        if t.get("type") != "function" or not isinstance(t.get("name"), str):
            raise ApiError(400, "only function tools are supported", f"tools.{i}")
        if not re.fullmatch(TOOL_NAME, t["name"]):
            raise ApiError(400, f"tool names must match {TOOL_NAME}", f"tools.{i}.name")
        parameters = t.get("parameters") or {}
        if not isinstance(parameters, dict):
            raise ApiError(400, "parameters must be a JSON schema object", f"tools.{i}.parameters")
        specs.append(ToolDef(t["name"], t.get("description") or None, parameters))
    return specs
