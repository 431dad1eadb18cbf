"""Text helpers of the serving layer: message text from content parts, a plain-text output
parser, and stop strings."""

from __future__ import annotations

from collections.abc import Collection, Sequence
from typing import Literal, Protocol

from resin.detokenizer import IncrementalDetokenizer
from resin.recipe.deltas import Delta, ParseResult, TextDelta
from resin.server.errors import ApiError
from resin.server.ports import TokenizerLike


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


class PlainTextParser:
    """An OutputParser for models without reasoning or tool syntax: everything is text."""

    def __init__(self, tokenizer: TokenizerLike, stop_token_ids: Sequence[int] = ()) -> None:
        self._detok = IncrementalDetokenizer(tokenizer)
        self._stops = frozenset(stop_token_ids)

    def feed(self, token_ids: Sequence[int]) -> list[Delta]:
        text = self._detok.push([t for t in token_ids if t not in self._stops])
        return [TextDelta(text)] if text else []

    def finish(self, reason: Literal["stop", "length"] = "stop") -> ParseResult:
        text = self._detok.flush()
        return ParseResult((TextDelta(text),) if text else (), reason, "", "")


class StopMatcher:
    """Finds stop strings in streamed text, holding back a tail that may start one.

    `push` returns (text safe to emit, whether a stop string was hit); after a hit the text
    ends just before the stop string and nothing more is accepted.
    """

    def __init__(self, stops: Sequence[str]) -> None:
        self.stops = tuple(s for s in stops if s)
        self._held = ""
        self.hit = False
        self.matched: str | None = None

    def push(self, text: str) -> tuple[str, bool]:
        if self.hit:
            return "", True
        if not self.stops:
            return text, False
        buf = self._held + text
        found = [(i, s) for s in self.stops if (i := buf.find(s)) >= 0]
        if found:
            cut, self.matched = min(found)
            self._held, self.hit = "", True
            return buf[:cut], True
        hold = max((self._overlap(buf, s) for s in self.stops), default=0)
        self._held = buf[len(buf) - hold :] if hold else ""
        return buf[: len(buf) - hold], False

    @staticmethod
    def _overlap(buf: str, stop: str) -> int:
        """Length of the longest suffix of `buf` that is a proper prefix of `stop`."""
        for n in range(min(len(buf), len(stop) - 1), 0, -1):
            if stop.startswith(buf[-n:]):
                return n
        return 0

    def flush(self) -> str:
        held, self._held = self._held, ""
        return "" if self.hit else held
