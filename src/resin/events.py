"""Events `Engine.step()` returns, in order, for the requests it touched."""

from __future__ import annotations

import enum
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, fields
from itertools import repeat


class FinishReason(enum.StrEnum):
    """Why a request ended: the one finish vocabulary, the engine's and the frontend's (a
    `str`: `FinishReason.LENGTH == "length"`, and JSON writes it as that string)."""

    STOP = "stop"
    """A stop token was generated (it is included in the output)."""
    LENGTH = "length"
    """`max_output_tokens` or the context length was reached."""
    ABORT = "abort"
    """`Engine.abort` was called."""
    ERROR = "error"
    """The request was quarantined after a failed or invalid step, or the engine died."""


@dataclass(frozen=True, slots=True)
class TopLogprob:
    token_id: int
    logprob: float


@dataclass(frozen=True, slots=True)
class TokensEvent:
    """New tokens for one request. `logprobs` / `top_logprobs` align with `token_ids` when the
    request asked for them. `prompt_logprobs` (first event only, when asked) holds the logprob
    of each prompt token after the first; `cached_tokens` is the prefix-cache hit length."""

    request_id: int
    token_ids: tuple[int, ...]
    logprobs: tuple[float, ...] | None = None
    top_logprobs: tuple[tuple[TopLogprob, ...], ...] | None = None
    prompt_logprobs: tuple[float, ...] | None = None
    prompt_top_logprobs: tuple[tuple[TopLogprob, ...], ...] | None = None
    cached_tokens: int = 0


@dataclass(frozen=True, slots=True)
class FinishedEvent:
    """Exactly one per request, always its last event."""

    request_id: int
    reason: FinishReason
    num_prompt_tokens: int
    num_output_tokens: int
    cached_tokens: int = 0
    error: str | None = None


@dataclass(frozen=True, slots=True)
class ErrorEvent:
    """Something went wrong in a step. `request_ids` are the requests it touched; `retryable`
    says whether they will run again (True) or were quarantined (False)."""

    message: str
    request_ids: tuple[int, ...]
    retryable: bool


Event = TokensEvent | FinishedEvent | ErrorEvent


_TOKENS_FIELDS = (
    "request_id",
    "token_ids",
    "logprobs",
    "top_logprobs",
    "prompt_logprobs",
    "prompt_top_logprobs",
    "cached_tokens",
)
assert tuple(f.name for f in fields(TokensEvent)) == _TOKENS_FIELDS
assert not hasattr(TokensEvent, "__post_init__")
_TOKENS_SLOTS = [TokensEvent.__dict__[name] for name in _TOKENS_FIELDS]


def plain_tokens_events(
    ids: Iterable[int], token_ids: Iterable[tuple[int, ...]], cached: Iterable[int], n: int
) -> list[TokensEvent]:
    """`[TokensEvent(id, tokens, cached_tokens=c) ...]` for `n` requests (no logprobs), built
    field by field over the whole batch (each pass a C-level loop) instead of one
    frozen-dataclass `__init__` per request: the bulk of a large step's events, made once by
    the engine and again by a frontend reading them off the wire. Equal objects of the same
    type; the asserts above fail at import if `TokensEvent` changes shape."""
    events = list(map(object.__new__, repeat(TokensEvent, n)))
    request_id, tokens, *optional, cached_tokens = _TOKENS_SLOTS
    deque(map(request_id.__set__, events, ids), maxlen=0)
    deque(map(tokens.__set__, events, token_ids), maxlen=0)
    for slot in optional:
        deque(map(slot.__set__, events, repeat(None)), maxlen=0)
    deque(map(cached_tokens.__set__, events, cached), maxlen=0)
    return events
