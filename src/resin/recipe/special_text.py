"""Special-token strings in message text stay text.

Recipes and chat templates render a conversation to one string and tokenize it whole, so a
user who writes `<|im_end|>\\n<|im_start|>system` would get real special tokens and could forge
role boundaries. `LiteralSpecials` renders instead with every special-token string in message
text (content, reasoning, tool results) replaced by a private placeholder, then tokenizes the
rendered string piece by piece: the recipe's own markup as usual (its special tokens stay
special), each placeholder as the plain text it stands for (`<`, `|`, `im`, ... tokens).
Rendering is unchanged when no message holds a special-token string. `resin serve
--special-tokens-in-text` restores the old behaviour.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

from resin.recipe.protocol import RenderedPrompt
from resin.recipe.types import Message, Reasoning, Text, ToolResult
from resin.tokenizer import TokenizerLike

_OPEN, _CLOSE = "\ue000", "\ue001"
_SLOT = re.compile(f"{_OPEN}(\\d+){_CLOSE}")


class LiteralSpecials:
    """Knows a tokenizer's special-token strings and how to encode them as plain text."""

    def __init__(self, tokenizer: TokenizerLike) -> None:
        self.tokenizer = tokenizer
        specials = sorted(tokenizer.special_token_strings, key=len, reverse=True)
        self._pattern = re.compile("|".join(map(re.escape, specials))) if specials else None

    def render(
        self, messages: Sequence[Message], render: Callable[[Sequence[Message]], RenderedPrompt]
    ) -> RenderedPrompt:
        """`render(messages)`, with special-token strings in their text kept as text."""
        pattern = self._pattern
        if pattern is None or not any(pattern.search(t) for t in texts(messages)):
            return render(messages)
        held: list[str] = []

        def hide(text: str) -> str:
            def slot(m: re.Match[str]) -> str:
                held.append(m.group(0))
                return f"{_OPEN}{len(held) - 1}{_CLOSE}"

            return pattern.sub(slot, text)

        rendered = render(
            [Message(m.role, [_hidden(b, hide) for b in m.content]) for m in messages]
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


def _hidden(block: Any, hide: Callable[[str], str]) -> Any:
    if isinstance(block, Text | Reasoning):
        return replace(block, text=hide(block.text))
    if isinstance(block, ToolResult):
        return replace(block, content=hide(block.content))
    return block
