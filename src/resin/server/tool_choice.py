"""`tool_choice` of the three APIs -> a `resin.recipe.ToolChoice` (or None for auto / none).

OpenAI chat: "required" or `{"type": "function", "function": {"name": X}}`; Responses: the same
or `{"type": "function", "name": X}`; Anthropic: `{"type": "any"}` or `{"type": "tool",
"name": X}`. A forced choice without tools, or naming a tool that is not in `tools`, is a 400;
the recipe then forces the call by a prompt prefix (`resin.recipe.tool_choice`), and a chat
format that cannot is a 400 from `Service.render`, never a silent `auto`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from resin.recipe.tool_choice import ToolChoice
from resin.recipe.types import ToolDef
from resin.server.errors import ApiError


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
