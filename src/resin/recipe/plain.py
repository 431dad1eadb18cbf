"""The output parser of a model without reasoning or tool syntax (and of raw completions):
every generated token is text."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

from resin.detokenizer import IncrementalDetokenizer
from resin.recipe.deltas import Delta, ParseResult, TextDelta
from resin.tokenizer import TokenizerLike


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
