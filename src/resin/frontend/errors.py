"""Why the frontend could not serve a request, by type (no protocol's status codes here).

A server maps each type to its own answer in one place (`resin.server.errors.api_error` for
HTTP: 429, 503, 400, 503, 503 in the order below).
"""

from __future__ import annotations


class FrontendError(Exception):
    """A request the frontend could not serve; the message is meant for the client."""


class QueueFull(FrontendError):
    """The intake queue (or the owner's share of it) has no free slot: retry later."""


class EngineUnavailable(FrontendError):
    """The engine died, the frontend is shutting down, or the request was aborted before it
    reached the engine."""


class RequestRefused(FrontendError):
    """The engine refused the request's input (its `submit` raised `ValueError`: the client's
    prompt, parameters or constraint are invalid)."""


class GenerationFailed(FrontendError):
    """A generation ended cut off (aborted or failed) where a complete answer was needed."""


class ClientTooSlow(FrontendError):
    """The reader fell too far behind the engine (its buffer overflowed); its request was
    aborted."""


def constraint_failed(error: str | None) -> bool:
    """Whether a generation's error is its constraint's ("constraint ...": the grammar hit a
    limit or refused the output): the client's request, never a retryable server fault."""
    return bool(error) and str(error).startswith("constraint ")
