"""Message text from a request body's content parts (OpenAI's and Anthropic's), and the JSON
arguments of the tool calls an earlier assistant turn made."""

from __future__ import annotations

import json
from collections.abc import Collection, Sequence
from typing import Protocol

from resin.server.errors import ApiError


class TextPart(Protocol):
    """A typed content part / block of a request body (OpenAI or Anthropic)."""

    @property
    def type(self) -> str: ...

    @property
    def text(self) -> str | None: ...


def parts_text(
    content: str | Sequence[TextPart] | None, where: str, text_types: Collection[str]
) -> str:
    """The text of a message's content: a string, or text parts joined; any other part is a
    400 naming where it was (`where`)."""
    if content is None or isinstance(content, str):
        return content or ""
    texts = []
    for part in content:
        if part.type in text_types and not isinstance(part.text, str):
            raise ApiError(400, f"a {part.type!r} content part needs a string 'text'", where)
        if part.type not in text_types or part.text is None:
            raise ApiError(400, f"content part type {part.type!r} is not supported here", where)
        texts.append(part.text)
    return "".join(texts)


def call_arguments(arguments: str, where: str) -> str:
    """An earlier call's arguments: a JSON object as text ("" for none), else a 400."""
    if not arguments.strip():
        return "{}"
    try:
        value = json.loads(arguments)
    except ValueError:
        value = None
    if not isinstance(value, dict):
        raise ApiError(400, "tool-call arguments must be a JSON object", f"{where}.arguments")
    return arguments
