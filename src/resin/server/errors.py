"""HTTP errors in OpenAI's shape (`/v1/*`) or Anthropic's (`/v1/messages`)."""

from __future__ import annotations

from typing import Any

from fastapi import Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException

_OPENAI_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    405: "invalid_request_error",
    413: "invalid_request_error",
    429: "rate_limit_exceeded",
    503: "service_unavailable",
}
_ANTHROPIC_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    405: "invalid_request_error",
    413: "request_too_large",
    429: "rate_limit_error",
    503: "overloaded_error",
}


class ApiError(Exception):
    """An error answer. `param` names the offending request field when known."""

    def __init__(
        self,
        status: int,
        message: str,
        param: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.headers = headers or {}


def is_anthropic_path(path: str) -> bool:
    return path.startswith("/v1/messages")


def error_body(path: str, status: int, message: str, param: str | None = None) -> dict[str, Any]:
    if is_anthropic_path(path):
        kind = _ANTHROPIC_TYPES.get(status, "api_error")
        return {"type": "error", "error": {"type": kind, "message": message}}
    kind = _OPENAI_TYPES.get(status, "server_error")
    return {
        "error": {"message": message, "type": kind, "param": param, "code": openai_code(status)}
    }


def openai_code(status: int) -> str | None:
    """OpenAI's `error.code` is a string or null (the HTTP status is not repeated there)."""
    return _OPENAI_CODES.get(status)


_OPENAI_CODES = {
    401: "invalid_api_key",
    404: "model_not_found",
    413: "request_too_large",
    429: "rate_limit_exceeded",
    503: "service_unavailable",
}


def error_response(
    path: str,
    status: int,
    message: str,
    param: str | None = None,
    headers: dict[str, str] | None = None,
) -> JSONResponse:
    return JSONResponse(error_body(path, status, message, param), status, headers=headers)


async def api_error_handler(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, ApiError)
    return error_response(request.url.path, exc.status, exc.message, exc.param, exc.headers)


async def validation_error_handler(request: Request, exc: Exception) -> JSONResponse:
    """FastAPI answers 422 by default; OpenAI and Anthropic clients expect 400."""
    assert isinstance(exc, RequestValidationError)
    first = exc.errors()[0] if exc.errors() else {}
    loc = [str(p) for p in first.get("loc", ()) if p != "body"]
    param = ".".join(loc) or None
    message = f"{param}: {first.get('msg', 'invalid request')}" if param else "invalid request"
    return error_response(request.url.path, 400, message, param)


async def http_error_handler(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, HTTPException)
    return error_response(request.url.path, exc.status_code, str(exc.detail))


async def unhandled_error_handler(request: Request, exc: Exception) -> JSONResponse:
    """A bug answers 500 and closes the connection *announced* (`Connection: close`), so a
    client reusing it does not run into a reset."""
    message = f"internal error: {type(exc).__name__}"
    return error_response(request.url.path, 500, message, headers={"connection": "close"})


async def disconnected_handler(request: Request, exc: Exception) -> JSONResponse:
    """The client left before its answer was ready (its generations were aborted); nobody
    reads this response, but answering keeps the failure out of the error log."""
    return error_response(request.url.path, 499, "client disconnected")


async def too_slow_handler(request: Request, exc: Exception) -> JSONResponse:
    """The answer fell too far behind the engine (an overloaded event loop)."""
    return error_response(request.url.path, 503, "server overloaded; retry", None)
