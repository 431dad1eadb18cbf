"""Request fields the APIs define and this server does not implement: a 400 naming the field.

Unknown fields stay tolerated (load generators send other servers' knobs), but a field a
client sends expecting an effect the server would not have is refused, never silently
ignored: `best_of` above `n`, `background`, audio output, legacy `functions`, stored chat
completions, beam search, a Responses `truncation` other than `disabled`, and so on. Each
table maps a field to the test that its value asks for something unimplemented; a field
whose value is harmless (`best_of` equal to `n`, `modalities: ["text"]`, `store: false`)
passes.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from resin.server.errors import ApiError

Check = Callable[[Any, Any], bool]
"""(value, body) -> whether the value asks for something this server does not do."""


def _given(value: Any, body: Any) -> bool:
    return value is not None


def _truthy(value: Any, body: Any) -> bool:
    return bool(value)


def _best_of(value: Any, body: Any) -> bool:
    return value is not None and value != getattr(body, "n", 1)


OPENAI_SHARED: dict[str, Check] = {
    "best_of": _best_of,  # n samples returned as they are is `n`; ranking them is not done
    "use_beam_search": _truthy,  # vLLM's
}
CHAT: dict[str, Check] = {
    **OPENAI_SHARED,
    "audio": _given,
    "modalities": lambda v, b: v is not None and list(v) != ["text"],
    "functions": _given,  # the legacy form of `tools`
    "function_call": _given,
    "web_search_options": _given,
    "store": _truthy,  # stored chat completions (GET /v1/chat/completions/{id})
}
COMPLETIONS: dict[str, Check] = OPENAI_SHARED  # (`suffix`: refused by the route itself)
RESPONSES: dict[str, Check] = {
    "background": _truthy,
    "truncation": lambda v, b: v not in (None, "disabled"),
    "conversation": _given,
    "prompt": _given,
    "max_tool_calls": _given,
    "top_logprobs": _truthy,
}
MESSAGES: dict[str, Check] = {
    "mcp_servers": _truthy,
    "container": _given,
    "context_management": _given,
}


def refuse_unsupported(body: Any, table: Mapping[str, Check]) -> None:
    """A 400 naming the first field of `table` whose value in `body` (a declared field or an
    extra one) asks for something this server does not implement."""
    extra = getattr(body, "model_extra", None) or {}
    for name, asks in table.items():
        value = getattr(body, name, None)
        value = extra.get(name) if value is None else value
        try:
            refused = asks(value, body)
        except TypeError:  # a value of the wrong shape asks for something unknown
            refused = True
        if refused:
            raise ApiError(400, f"'{name}' is not supported by this server", name)
