"""Special-token strings in message text stay text.

Recipes and chat templates render a conversation to one string and tokenize it whole, so a
user who writes `<|im_end|>\\n<|im_start|>system` would get real special tokens and could forge
role boundaries. `LiteralSpecials` renders instead with every special-token string in text a
client wrote replaced by a private placeholder, then tokenizes the rendered string piece by
piece: the recipe's own markup as usual (its special tokens stay special), each placeholder as
the plain text it stands for (`<`, `|`, `im`, ... tokens). Client text is everything but the
recipe's markup: message content, reasoning, tool results, the assistant's earlier tool calls
(names and JSON arguments, also when the JSON spells a special token with `\\u` escapes) and
the tool definitions (names, descriptions, every key and string of the parameter schemas).
Rendering is unchanged when none holds a special-token string. `resin serve
--special-tokens-in-text` restores the old behaviour.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator, Sequence
from dataclasses import replace
from typing import Any

from resin.recipe.protocol import RenderedPrompt
from resin.recipe.types import Message, Reasoning, Text, ToolCall, ToolDef, ToolResult
from resin.tokenizer import TokenizerLike

Render = Callable[[Sequence[Message], Sequence[ToolDef]], RenderedPrompt]

_OPEN, _CLOSE = "\ue000", "\ue001"
_SLOT = re.compile(f"{_OPEN}(\\d+){_CLOSE}")


class LiteralSpecials:
    """Knows a tokenizer's special-token strings and how to encode them as plain text."""

    def __init__(self, tokenizer: TokenizerLike) -> None:
        self.tokenizer = tokenizer
        specials = sorted(tokenizer.special_token_strings, key=len, reverse=True)
        self._pattern = re.compile("|".join(map(re.escape, specials))) if specials else None

    def render(
        self, messages: Sequence[Message], tools: Sequence[ToolDef], render: Render
    ) -> RenderedPrompt:
        """`render(messages, tools)`, with special-token strings in their text kept as text."""
        pattern = self._pattern
        if pattern is None or not any(pattern.search(t) for t in client_texts(messages, tools)):
            return render(messages, tools)
        held: list[str] = []

        def hide(text: str) -> str:
            def slot(m: re.Match[str]) -> str:
                held.append(m.group(0))
                return f"{_OPEN}{len(held) - 1}{_CLOSE}"

            return pattern.sub(slot, text)

        rendered = render(
            [Message(m.role, [_hidden(b, hide) for b in m.content]) for m in messages],
            [_hidden_tool(t, hide) for t in tools],
        )
        if rendered.multimodal:  # image placeholders index token_ids: do not re-tokenize
            raise ValueError("special-token text in a message with images is not supported")
        ids: list[int] = []
        text: list[str] = []
        pos = 0
        for m in _SLOT.finditer(rendered.text):
            markup = rendered.text[pos : m.start()]
            if markup:
                ids += self.tokenizer.encode(markup)
            literal = held[int(m.group(1))]
            ids += self.tokenizer.encode_plain(literal)
            text += [markup, literal]
            pos = m.end()
        if rendered.text[pos:]:
            ids += self.tokenizer.encode(rendered.text[pos:])
        text.append(rendered.text[pos:])
        prefill = _SLOT.sub(lambda m: held[int(m.group(1))], rendered.prefill)
        return replace(rendered, token_ids=ids, text="".join(text), prefill=prefill)


def texts(messages: Sequence[Message]) -> list[str]:
    """The text a client wrote into `messages`: text, reasoning and tool results."""
    out: list[str] = []
    for m in messages:
        for b in m.content:
            if isinstance(b, Text | Reasoning):
                out.append(b.text)
            elif isinstance(b, ToolResult):
                out.append(b.content)
    return out


def client_texts(messages: Sequence[Message], tools: Sequence[ToolDef]) -> Iterator[str]:
    """Every text a client wrote into a conversation: `texts`, tool calls (their arguments
    decoded too) and tool definitions."""
    yield from texts(messages)
    for m in messages:
        for b in m.content:
            if isinstance(b, ToolCall):
                yield from (b.name, b.arguments, *_strings(b.parsed_arguments()))
            elif isinstance(b, ToolResult) and b.name:
                yield b.name
    for t in tools:
        yield from (t.name, t.description or "", *_strings(dict(t.parameters)))


def _strings(value: Any) -> Iterator[str]:
    """Every string in a JSON value, object keys included."""
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for k, v in value.items():
            yield str(k)
            yield from _strings(v)
    elif isinstance(value, list):
        for v in value:
            yield from _strings(v)


def _hidden_json(value: Any, hide: Callable[[str], str]) -> Any:
    if isinstance(value, str):
        return hide(value)
    if isinstance(value, dict):
        return {hide(str(k)): _hidden_json(v, hide) for k, v in value.items()}
    if isinstance(value, list):
        return [_hidden_json(v, hide) for v in value]
    return value


def _hidden_arguments(arguments: str, hide: Callable[[str], str]) -> str:
    """JSON arguments with their special-token strings hidden: in the text as written, or,
    when only the decoded JSON holds one (a `\\u`-escaped spelling), in the decoded value
    re-serialized (the form recipes print anyway)."""
    text = hide(arguments)
    if text != arguments:
        return text
    try:
        value = json.loads(arguments)
    except ValueError:
        return arguments
    hidden = _hidden_json(value, hide)
    return arguments if hidden == value else json.dumps(hidden, ensure_ascii=False)


def _hidden(block: Any, hide: Callable[[str], str]) -> Any:
    if isinstance(block, Text | Reasoning):
        return replace(block, text=hide(block.text))
    if isinstance(block, ToolResult):
        name = None if block.name is None else hide(block.name)
        return replace(block, content=hide(block.content), name=name)
    if isinstance(block, ToolCall):
        return replace(
            block, name=hide(block.name), arguments=_hidden_arguments(block.arguments, hide)
        )
    return block


def _hidden_tool(tool: ToolDef, hide: Callable[[str], str]) -> ToolDef:
    description = None if tool.description is None else hide(tool.description)
    parameters = _hidden_json(dict(tool.parameters), hide)
    return ToolDef(hide(tool.name), description, parameters)
