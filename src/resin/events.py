"""Events `Engine.step()` returns, in order, for the requests it touched."""

from __future__ import annotations

import enum
from dataclasses import dataclass


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
