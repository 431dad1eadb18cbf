"""POST /v1/messages (Anthropic Messages API), stream and not, with thinking and tool_use.

Stream order (Anthropic's): message_start (real input token count) -> per content block i =
0, 1, ...: content_block_start -> content_block_delta* -> content_block_stop ->
message_delta (stop_reason, output_tokens) -> message_stop. Errors use Anthropic's shape.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncGenerator, Iterator
from typing import Any

from fastapi import APIRouter, Request
from starlette.responses import JSONResponse, Response

from resin.frontend.errors import constraint_failed
from resin.frontend.generation import Finish, Update
from resin.frontend.intake import Generations
from resin.recipe.types import Block as Part
from resin.recipe.types import Message, Reasoning, Text, ToolCall, ToolDef, ToolResult
from resin.server.asgi import SSEResponse, sse, until_disconnect
from resin.server.chat_setup import ChatSetup, start_chat
from resin.server.errors import ApiError
from resin.server.items import Item, Items
from resin.server.media import anthropic_blocks
from resin.server.schemas_anthropic import Block, CountTokensRequest, MessagesRequest
from resin.server.service import Service
from resin.server.structured import anthropic_format
from resin.server.text import parts_text
from resin.server.tool_choice import anthropic_choice
from resin.server.unsupported import MESSAGES, refuse_unsupported

router = APIRouter()


def _block_text(content: str | list[Block] | None, where: str) -> str:
    return parts_text(content, where, ("text",))


def to_messages(body: MessagesRequest | CountTokensRequest) -> list[Message]:
    out = [Message("system", _block_text(body.system, "system"))] if body.system else []
    for i, m in enumerate(body.messages):
        where = f"messages.{i}.content"
        if isinstance(m.content, str):
            out.append(Message(m.role, m.content))
            continue
        images = anthropic_blocks(m.content, where) if m.role == "user" else None
        if images is not None:
            out.append(Message(m.role, images))
            continue
        text, thinking, calls = [], [], []
        for b in m.content:
            if b.type == "text" and b.text is not None:
                text.append(b.text)
            elif b.type == "thinking" and m.role == "assistant":
                thinking.append(b.thinking or "")
            elif b.type == "tool_use" and m.role == "assistant" and b.name:
                calls.append(ToolCall(b.id or "", b.name, json.dumps(b.input or {})))
            elif b.type == "tool_result" and m.role == "user":
                content = b.content if isinstance(b.content, str | list) else ""
                result = ToolResult(b.tool_use_id or "", _block_text(content, where))
                out.append(Message("tool", [result]))
            elif b.type == "text":
                raise ApiError(400, "a 'text' content block needs a string 'text'", where)
            else:
                raise ApiError(400, f"content block {b.type!r} is not supported", where)
        if text or thinking or calls:
            blocks: list[Part] = [Reasoning("".join(thinking))] if "".join(thinking) else []
            blocks += [Text("".join(text))] if "".join(text) else []
            out.append(Message(m.role, [*blocks, *calls]))
    return out


def tools_of(body: MessagesRequest | CountTokensRequest) -> list[ToolDef]:
    if not body.tools or (body.tool_choice and body.tool_choice.type == "none"):
        return []
    return [ToolDef(t.name, t.description or None, t.input_schema) for t in body.tools]


def stop_reason(finish: Finish, stop_hit: str | None, has_tools: bool) -> str:
    if stop_hit is not None:
        return "stop_sequence"
    if finish.reason == "length":
        return "max_tokens"
    return "tool_use" if has_tools else "end_turn"


def usage(finish: Finish | None, prompt_tokens: int, cached: int) -> dict[str, Any]:
    """Anthropic's meaning: `input_tokens` excludes the prompt tokens read from the cache, so
    the prompt is input + cache_read + cache_creation (the last is 0: pages are cached as a
    side effect, never billed as a write). `cached` counts before the finish (message_start)."""
    cached = finish.cached_tokens if finish else cached
    return {
        "input_tokens": prompt_tokens - cached,
        "output_tokens": finish.completion_tokens if finish else 0,
        "cache_read_input_tokens": cached,
        "cache_creation_input_tokens": 0,
    }


def ends_with_prefill(messages: list[Message]) -> bool:
    """A last message from the assistant is a prefill the model continues (Anthropic's rule:
    its text may not end with whitespace)."""
    if not messages or messages[-1].role != "assistant":
        return False
    if messages[-1].text != messages[-1].text.rstrip():
        raise ApiError(
            400, "final assistant content cannot end with trailing whitespace", "messages"
        )
    return True


def output_format(body: MessagesRequest) -> Any:
    """The structured-output format: `output_config.format` (what current SDKs send, e.g.
    `messages.parse`) or the older top-level `output_format`; both at once is a 400."""
    config = body.output_config or {}
    for key in sorted(set(config) - {"format"}):
        raise ApiError(400, f"output_config.{key} is not supported", f"output_config.{key}")
    given = config.get("format")
    if given is not None and body.output_format is not None:
        raise ApiError(400, "give output_config.format or output_format, not both", "output_config")
    return body.output_format if given is None else given


def setup(body: MessagesRequest) -> ChatSetup:
    tools = tools_of(body)
    tc = body.tool_choice
    messages = to_messages(body)
    return ChatSetup(
        messages,
        tools,
        anthropic_choice(tc.type, tc.name, tools) if tc else None,
        None if body.thinking is None else body.thinking.type != "disabled",
        body.max_tokens,
        {"temperature": body.temperature, "top_p": body.top_p, "top_k": body.top_k},
        anthropic_format(output_format(body)),
        continue_final=ends_with_prefill(messages),
    )


@router.post("/v1/messages", response_model=None)
async def messages(body: MessagesRequest, request: Request) -> Response:
    svc: Service = request.app.state.service
    svc.check_model(body.model)
    refuse_unsupported(body, MESSAGES)
    stops = body.stop_sequences or []
    rendered, gens = await start_chat(svc, request, lambda: setup(body), 1, stops, body)
    builder = MessageBuilder(svc, len(rendered.token_ids), gens)
    if body.stream:
        return SSEResponse(builder.stream(), on_close=gens.cancel, error_frame=anthropic_error)
    return JSONResponse(await until_disconnect(request, builder.collect()))


def anthropic_error(message: str) -> str:
    kind = "invalid_request_error" if constraint_failed(message) else "api_error"
    return sse({"type": "error", "error": {"type": kind, "message": message}}, "error")


@router.post("/v1/messages/count_tokens", response_model=None)
async def count_tokens(body: CountTokensRequest, request: Request) -> Response:
    """The prompt size of a Messages request (Anthropic clients call this before sending)."""
    svc: Service = request.app.state.service
    svc.check_model(body.model)
    thinking = None if body.thinking is None else body.thinking.type != "disabled"
    messages = to_messages(body)
    rendered = await svc.render(
        messages, tools_of(body), thinking, None, ends_with_prefill(messages)
    )
    return JSONResponse({"input_tokens": len(rendered.token_ids)})


class MessageBuilder:
    """Turns deltas into content blocks; renders SSE events or the final message."""

    def __init__(self, svc: Service, input_tokens: int, gens: Generations) -> None:
        self.svc = svc
        self.gens = gens
        self.input_tokens = input_tokens
        self.id = f"msg_{uuid.uuid4().hex}"
        self.items = Items()

    def message(self, finish: Finish | None) -> dict[str, Any]:
        has_tools = bool(self.items.of("tool_call"))
        matched = self.gens.gens[0].stops.matched
        return {
            "id": self.id,
            "type": "message",
            "role": "assistant",
            "model": self.svc.model,
            "content": [_block(it) for it in self.items.all],
            "stop_reason": None if finish is None else stop_reason(finish, matched, has_tools),
            "stop_sequence": matched,
            "usage": usage(finish, self.input_tokens, self.gens.gens[0].cached_tokens),
        }

    def _frames(self, up: Update) -> Iterator[str]:
        for change, it, piece in self.items.feed(up.deltas, up.finish is not None):
            if change == "open":
                start = {
                    "type": "content_block_start",
                    "index": it.index,
                    "content_block": _block(it),
                }
                yield sse(start, event="content_block_start")
            elif change == "grow":
                key, kind = _DELTAS[it.kind]
                yield _delta(it.index, {"type": kind, key: piece})
            else:
                if it.kind == "reasoning":
                    yield _delta(it.index, {"type": "signature_delta", "signature": ""})
                stop = {"type": "content_block_stop", "index": it.index}
                yield sse(stop, event="content_block_stop")

    async def stream(self) -> AsyncGenerator[str, None]:
        start = self.message(None)
        yield sse({"type": "message_start", "message": start}, event="message_start")
        yield sse({"type": "ping"}, event="ping")
        async for _, up in self.gens.updates():
            for frame in self._frames(up):
                yield frame
            if up.finish is None:
                continue
            if up.finish.failed:
                # Truncated: an error event, never a message_delta with a stop_reason.
                yield anthropic_error(up.finish.error or "generation failed")
                return
            final = self.message(up.finish)
            delta = {"stop_reason": final["stop_reason"], "stop_sequence": final["stop_sequence"]}
            yield sse(
                {"type": "message_delta", "delta": delta, "usage": final["usage"]},
                event="message_delta",
            )
            yield sse({"type": "message_stop"}, event="message_stop")

    async def collect(self) -> dict[str, Any]:
        (up,) = await self.gens.collect()
        self.items.add(up.deltas, last=True)
        return self.message(up.finish)


_DELTAS = {
    "text": ("text", "text_delta"),
    "reasoning": ("thinking", "thinking_delta"),
    "tool_call": ("partial_json", "input_json_delta"),
}


def _delta(index: int, delta: dict[str, Any]) -> str:
    body = {"type": "content_block_delta", "index": index, "delta": delta}
    return sse(body, event="content_block_delta")


def _block(it: Item) -> dict[str, Any]:
    """A content block as it stands (a tool call's input once its JSON is complete)."""
    if it.kind == "text":
        return {"type": "text", "text": it.text}
    if it.kind == "reasoning":
        return {"type": "thinking", "thinking": it.text, "signature": ""}
    tool_id = f"toolu_{it.call_id.removeprefix('call_')}"  # Anthropic's id shape
    block: dict[str, Any] = {"type": "tool_use", "id": tool_id, "name": it.name, "input": {}}
    if it.done:
        raw = it.text or "{}"
        try:
            block["input"] = json.loads(raw)
        except ValueError:
            block["input"] = {"_raw": raw}
    return block
