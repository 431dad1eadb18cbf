"""What the server needs from the engine, the tokenizer and an output parser, as Protocols.

The server runs on the real `resin.Engine` and a `resin.recipe.Recipe`; the tests' doubles
(`tests/server/doubles.py`) implement the same contracts. Conversations are
`resin.recipe.Message`s and tools `resin.recipe.ToolDef`s from the HTTP body to the recipe.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal, Protocol

from resin.events import Event
from resin.params import SamplingParams
from resin.plan import MediaItem
from resin.recipe.deltas import Delta, ParseResult

__all__ = ["EngineLike", "OutputParser", "RequestHandle", "TokenizerLike"]


class RequestHandle(Protocol):
    """The part of `resin.Request` the server reads."""

    @property
    def id(self) -> int: ...


class EngineLike(Protocol):
    """A synchronous engine driven by exactly one thread (the server's actor)."""

    @property
    def context_length(self) -> int: ...

    @property
    def num_waiting(self) -> int: ...

    @property
    def num_running(self) -> int: ...

    def submit(
        self,
        prompt_token_ids: Sequence[int],
        sampling_params: SamplingParams | None = None,
        *,
        media: Sequence[MediaItem] = (),
    ) -> RequestHandle: ...

    def step(self) -> list[Event]: ...

    def abort(self, request: Any) -> None: ...

    def has_work(self) -> bool: ...

    def close(self) -> None: ...


class TokenizerLike(Protocol):
    """Text <-> token ids (the part of `resin.tokenizer.Tokenizer` the server uses)."""

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]: ...

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = False) -> str: ...

    @property
    def vocab_size(self) -> int: ...

    @property
    def eos_token_ids(self) -> tuple[int, ...]: ...

    @property
    def special_token_strings(self) -> Sequence[str]: ...

    def encode_plain(self, text: str) -> list[int]:
        """`text` with special-token matching off (their strings stay text)."""
        ...


class OutputParser(Protocol):
    """Turns generated token ids into typed deltas, incrementally (a recipe's
    `ResponseParser`, or `text.PlainTextParser`); `finish` flushes."""

    def feed(self, token_ids: Sequence[int]) -> list[Delta]: ...

    def finish(self, reason: Literal["stop", "length"] = "stop") -> ParseResult: ...
