"""HTTP errors in OpenAI's shape (`/v1/*`) or Anthropic's (`/v1/messages`), and the one map
from the frontend's typed failures (`resin.frontend.errors`) to HTTP statuses."""

from __future__ import annotations

import re
from typing import Any

from fastapi import Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException

from resin.frontend.errors import (
    ClientTooSlow,
    EngineUnavailable,
    FrontendError,
    GenerationFailed,
    QueueFull,
    RequestRefused,
)

# status -> (OpenAI error type, OpenAI error code, Anthropic error type); others are
# server_error / null / api_error. A 404's code is null here: only the unknown-model 404 says
# `model_not_found` (its ApiError carries the code), not an unknown response id or route.
_KINDS: dict[int, tuple[str, str | None, str]] = {
    400: ("invalid_request_error", None, "invalid_request_error"),
    401: ("authentication_error", "invalid_api_key", "authentication_error"),
    403: ("permission_error", None, "permission_error"),
    404: ("not_found_error", None, "not_found_error"),
    405: ("invalid_request_error", None, "invalid_request_error"),
    408: ("invalid_request_error", "request_timeout", "invalid_request_error"),
    413: ("invalid_request_error", "request_too_large", "request_too_large"),
    429: ("rate_limit_exceeded", "rate_limit_exceeded", "rate_limit_error"),
    503: ("service_unavailable", "service_unavailable", "overloaded_error"),
}


class ClientDisconnected(Exception):
    """The client went away before the answer was ready."""


class ApiError(Exception):
    """An error answer. `param` names the offending request field when known; `code` is
    OpenAI's `error.code` when it is not the status's usual one."""

    def __init__(
        self,
        status: int,
        message: str,
        param: str | None = None,
        headers: dict[str, str] | None = None,
        code: str | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.headers = headers or {}
        self.code = code

    def __reduce__(self) -> tuple[Any, ...]:
        # Pickled whole: a frontend process of `resin serve` gets it back from the response
        # store the frontends share.
        return (type(self), (self.status, self.message, self.param, self.headers, self.code))


_FRONTEND_STATUS: dict[type[FrontendError], int] = {
    QueueFull: 429,
    EngineUnavailable: 503,
    RequestRefused: 400,
    GenerationFailed: 503,
    ClientTooSlow: 503,
}


def api_error(exc: FrontendError, retry_after_s: int | None = None) -> ApiError:
    """The HTTP answer to a frontend failure: its status by type, its message as is (a
    reader too slow to keep up is told to retry); a 429 says when to retry."""
    status = next((s for kind, s in _FRONTEND_STATUS.items() if isinstance(exc, kind)), 503)
    message = "server overloaded; retry" if isinstance(exc, ClientTooSlow) else str(exc)
    headers = None
    if status == 429 and retry_after_s is not None:
        headers = {"Retry-After": str(retry_after_s)}
    return ApiError(status, message, headers=headers)


MAX_MESSAGE = 1000
"""Characters of an error message; a longer one is cut (with its length said)."""
_REPR = re.compile(r"<[\w.]+ object at 0x[0-9a-fA-F]+>")
_LONG = re.compile(r"\S{97,}")


def tidy(message: str) -> str:
    """An error message safe to send: no Python object reprs (`<_io.BytesIO object at 0x..>`
    from a decoder), an echoed value longer than 96 characters cut to its start (a 60 KB id
    is not sent back), at most `MAX_MESSAGE` characters."""
    message = _REPR.sub("<data>", message)
    message = _LONG.sub(lambda m: f"{m.group(0)[:48]}... ({len(m.group(0))} characters)", message)
    if len(message) > MAX_MESSAGE:
        message = f"{message[: MAX_MESSAGE - 40]}... ({len(message)} characters)"
    return message


def error_body(
    path: str, status: int, message: str, param: str | None = None, code: str | None = None
) -> dict[str, Any]:
    """The error in the shape of the API `path` belongs to (Anthropic's for `/v1/messages`;
    OpenAI's `code` is a string or null: the HTTP status is not repeated there). The message
    and `param` go through `tidy`."""
    kind, usual, anthropic = _KINDS.get(status, ("server_error", None, "api_error"))
    code = code or usual
    message = tidy(message)
    param = None if param is None else tidy(param)
    if path.startswith("/v1/messages"):
        return {"type": "error", "error": {"type": anthropic, "message": message}}
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


async def error_handler(request: Request, exc: Exception) -> JSONResponse:
    """Every error's answer. FastAPI's 422 for a bad body is the 400 OpenAI and Anthropic
    clients expect; a client gone before its answer (its generations were aborted) gets a 499
    nobody reads, which keeps it out of the error log; an answer that fell too far behind the
    engine is a 503; a bug is a 500 that closes the connection *announced* (`Connection:
    close`), so a client reusing it does not run into a reset."""
    status, param, headers, code = 500, None, None, None
    if isinstance(exc, ApiError):
        status, message, param, headers = exc.status, exc.message, exc.param, exc.headers
        code = exc.code
    elif isinstance(exc, RequestValidationError):
        status, message, param = 400, *_invalid(request, exc)
    elif isinstance(exc, HTTPException):
        status, message = exc.status_code, str(exc.detail)
    elif isinstance(exc, ClientDisconnected):
        status, message = 499, "client disconnected"
    elif isinstance(exc, FrontendError):
        http = api_error(exc)
        status, message, headers = http.status, http.message, http.headers
    else:
        message = f"internal error: {type(exc).__name__}"
        headers = {"connection": "close"}
    body = error_body(request.url.path, status, message, param, code)
    return JSONResponse(body, status, headers=headers)


def _invalid(request: Request, exc: RequestValidationError) -> tuple[str, str | None]:
    """The message and `param` of a body FastAPI could not validate. The body as a whole (not
    JSON, no JSON content type, empty, not an object) is said in words with no `param`;
    a field's error names the field."""
    first = exc.errors()[0] if exc.errors() else {}
    loc = tuple(first.get("loc", ()))
    if first.get("type") == "json_invalid":
        at = loc[1] if len(loc) > 1 else "?"
        reason = (first.get("ctx") or {}).get("error", "invalid JSON")
        return f"the request body is not valid JSON ({reason} at character {at})", None
    if loc == ("body",):
        kind = request.headers.get("content-type")
        if kind is None or "json" not in kind.lower():
            got = f"Content-Type {kind!r}" if kind else "no Content-Type header"
            return (
                f"the request body must be JSON sent with Content-Type: application/json "
                f"(got {got})",
                None,
            )
        if first.get("type") == "missing":
            return "the request body is empty; send a JSON object", None
        return "the request body must be a JSON object", None
    param = ".".join(str(p) for p in loc if p != "body") or None
    return (f"{param}: {first.get('msg', 'invalid')}" if param else "invalid request"), param
