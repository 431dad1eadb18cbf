"""POST /v1/responses (OpenAI Responses API), stream and not.

Stream order (OpenAI's): response.created -> response.in_progress -> per output item
(reasoning, message, function_call, in the order the model produced them): output_item.added
-> content events -> output_item.done -> exactly one of response.completed | incomplete |
failed. Item ids in the stream equal those of the final response.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncGenerator, Callable, Iterator
from typing import Any, Literal

from fastapi import APIRouter, Query, Request
from starlette.responses import JSONResponse, Response

from resin.events import FinishReason
from resin.frontend.generation import Finish, Update
from resin.frontend.intake import Generations
from resin.params import SamplingParams
from resin.server.asgi import SSEResponse, sse, until_disconnect
from resin.server.chat_setup import ChatSetup, start_chat
from resin.server.errors import ApiError
from resin.server.items import Change, Item, Items
from resin.server.responses_input import (
    ResponsesRequest,
    input_items,
    listed_items,
    to_messages,
    tools_of,
)
from resin.server.service import Service
from resin.server.structured import responses_format
from resin.server.tool_choice import openai_choice
from resin.server.unsupported import RESPONSES, refuse_unsupported

router = APIRouter()


@router.post("/v1/responses", response_model=None)
async def create_response(body: ResponsesRequest, request: Request) -> Response:
    svc: Service = request.app.state.service
    svc.check_model(body.model)
    refuse_unsupported(body, RESPONSES)
    inputs = input_items(body.input)
    if body.previous_response_id:
        prior = svc.responses.get(body.previous_response_id, "previous_response_id")
        inputs = [*prior.conversation, *inputs]
        body = body.model_copy(update={"input": inputs})
    _, gens = await start_chat(svc, request, lambda: setup(body), body=body)
    builder = ResponseBuilder(svc, body, gens.params[0] if gens.params else None)
    if body.store is not False:
        builder.on_done = lambda response: svc.responses.put(response, inputs)
    if body.stream:
        return SSEResponse(builder.stream(gens), on_close=gens.cancel, error_frame=builder.failed)
    return JSONResponse(await until_disconnect(request, builder.collect(gens)))


@router.get("/v1/responses/{response_id}", response_model=None)
async def get_response(response_id: str, request: Request) -> JSONResponse:
    svc: Service = request.app.state.service
    return JSONResponse(svc.responses.get(response_id).response)


@router.get("/v1/responses/{response_id}/input_items", response_model=None)
async def get_input_items(
    response_id: str,
    request: Request,
    limit: int = Query(20, ge=1, le=100),
    order: Literal["asc", "desc"] = "desc",
    after: str | None = None,
) -> JSONResponse:
    """The input items of a stored response (previous turns included), as OpenAI lists them:
    newest first unless `order=asc`, `limit` per page, the page after item `after`."""
    svc: Service = request.app.state.service
    stored = svc.responses.get(response_id)
    kept = len(stored.conversation) - len(stored.response["output"])
    items = listed_items(stored.conversation[:kept], response_id)
    if order == "desc":
        items.reverse()
    ids = [it["id"] for it in items]
    if after is not None and after not in ids:
        raise ApiError(400, f"no input item {after!r} in this response", "after")
    start = 0 if after is None else ids.index(after) + 1
    page = items[start : start + limit]
    return JSONResponse(
        {
            "object": "list",
            "data": page,
            "first_id": page[0]["id"] if page else None,
            "last_id": page[-1]["id"] if page else None,
            "has_more": start + limit < len(items),
        }
    )


@router.delete("/v1/responses/{response_id}", response_model=None)
async def delete_response(response_id: str, request: Request) -> JSONResponse:
    svc: Service = request.app.state.service
    svc.responses.delete(response_id)
    return JSONResponse({"id": response_id, "object": "response", "deleted": True})


def setup(body: ResponsesRequest) -> ChatSetup:
    tools = tools_of(body)
    effort = (body.reasoning or {}).get("effort")
    return ChatSetup(
        to_messages(body),
        tools,
        openai_choice(body.tool_choice, tools),
        None if effort is None else effort not in ("none", "minimal"),
        body.max_output_tokens,
        {"temperature": body.temperature, "top_p": body.top_p},
        responses_format(body.text),
    )


class ResponseBuilder:
    """Tracks output items while deltas arrive; renders stream events or the final object."""

    def __init__(
        self, svc: Service, body: ResponsesRequest, params: SamplingParams | None = None
    ) -> None:
        self.svc = svc
        self.body = body
        self.params = params
        """The sampling the answer ran with (the checkpoint's defaults for omitted fields):
        echoed as OpenAI does, never `null` for a default that applied."""
        self.id = f"resp_{uuid.uuid4().hex}"
        self.created_at = int(time.time())
        self.items = Items()
        self.seq = 0
        self.on_done: Callable[[dict[str, Any]], None] | None = None
        """Called with the final response of a completed or incomplete answer (the store)."""

    def response(self, status: str, finish: Finish | None = None) -> dict[str, Any]:
        usage = None
        if finish is not None:
            usage = {
                "input_tokens": finish.prompt_tokens,
                "input_tokens_details": {"cached_tokens": finish.cached_tokens},
                "output_tokens": finish.completion_tokens,
                "output_tokens_details": {"reasoning_tokens": 0},
                "total_tokens": finish.prompt_tokens + finish.completion_tokens,
            }
        incomplete = {"reason": "max_output_tokens"} if status == "incomplete" else None
        p = self.params
        error = None
        if status == "failed":
            error = {"code": "server_error", "message": finish.error if finish else "failed"}
        return {
            "id": self.id,
            "object": "response",
            "created_at": self.created_at,
            "status": status,
            "model": self.svc.model,
            "output": [_output(it) for it in self.items.all],
            "usage": usage,
            "error": error,
            "incomplete_details": incomplete,
            "instructions": self.body.instructions,
            "metadata": self.body.metadata or {},
            "parallel_tool_calls": True,
            "tool_choice": self.body.tool_choice or "auto",
            "tools": self.body.tools or [],
            "temperature": self.body.temperature if p is None else p.temperature,
            "top_p": self.body.top_p if p is None else p.top_p,
            "max_output_tokens": self.body.max_output_tokens or (p and p.max_output_tokens),
            "text": self.body.text or {"format": {"type": "text"}},
            "reasoning": self.body.reasoning,
            "previous_response_id": self.body.previous_response_id,
            "store": self.body.store is not False,
        }

    def event(self, kind: str, **fields: Any) -> str:
        self.seq += 1
        return sse({"type": kind, "sequence_number": self.seq - 1, **fields}, event=kind)

    def _frames(self, up: Update) -> Iterator[str]:
        cut = up.finish is not None and up.finish.reason == "length"
        for change, it, piece in self.items.feed(up.deltas, up.finish is not None, cut):
            yield from self._changed(change, it, piece)
        if up.finish is not None:
            yield from self._end(up.finish)

    def _changed(self, change: Change, it: Item, piece: str) -> Iterator[str]:
        item = _output(it)
        at: dict[str, Any] = {"item_id": item["id"], "output_index": it.index}
        if it.kind != "tool_call":
            at["content_index"] = 0
        if change == "open":
            added = item if it.kind == "tool_call" else dict(item, content=[])
            yield self.event("response.output_item.added", output_index=it.index, item=added)
            if it.kind == "text":
                yield self.event("response.content_part.added", **at, part=item["content"][0])
        elif change == "grow" and it.kind == "tool_call":
            yield self.event("response.function_call_arguments.delta", **at, delta=piece)
        elif change == "grow" and it.kind == "text":
            yield self.event("response.output_text.delta", **at, delta=piece, logprobs=[])
        elif change == "grow":
            yield self.event("response.reasoning_text.delta", **at, delta=piece)
        else:
            if it.kind == "text":
                text = it.text
                yield self.event("response.output_text.done", **at, text=text, logprobs=[])
                yield self.event("response.content_part.done", **at, part=item["content"][0])
            elif it.kind == "reasoning":
                yield self.event("response.reasoning_text.done", **at, text=it.text)
            else:
                done = {"arguments": it.text, "name": it.name}
                yield self.event("response.function_call_arguments.done", **at, **done)
            yield self.event("response.output_item.done", output_index=it.index, item=item)

    def _end(self, finish: Finish) -> Iterator[str]:
        status = {"length": "incomplete", "error": "failed", "abort": "failed"}.get(
            finish.reason, "completed"
        )
        final = self.response(status, finish)
        if status != "failed" and self.on_done is not None:
            self.on_done(final)
        yield self.event(f"response.{status}", response=final)

    def failed(self, message: str) -> str:
        """`response.failed` for an answer cut off outside the engine (a too-slow reader)."""
        finish = Finish(FinishReason.ERROR, 0, 0, 0, message)
        return self.event("response.failed", response=self.response("failed", finish))

    # ---- the two answers -------------------------------------------------------------
    async def stream(self, gens: Generations) -> AsyncGenerator[str, None]:
        yield self.event("response.created", response=self.response("in_progress"))
        yield self.event("response.in_progress", response=self.response("in_progress"))
        async for _, up in gens.updates():
            for frame in self._frames(up):
                yield frame

    async def collect(self, gens: Generations) -> dict[str, Any]:
        (up,) = await gens.collect()
        assert up.finish is not None
        self.items.add(up.deltas, last=True, cut=up.finish.reason == "length")
        status = "incomplete" if up.finish.reason == "length" else "completed"
        final = self.response(status, up.finish)
        if self.on_done is not None:
            self.on_done(final)
        return final


def _output(it: Item) -> dict[str, Any]:
    """An output item as it stands (`incomplete` when the length limit cut it)."""
    status = "incomplete" if it.cut else "completed" if it.done else "in_progress"
    if it.kind == "text":
        part = {"type": "output_text", "text": it.text, "annotations": [], "logprobs": []}
        return {
            "type": "message",
            "id": f"msg_{it.id}",
            "status": status,
            "role": "assistant",
            "content": [part],
        }
    if it.kind == "reasoning":
        content = [{"type": "reasoning_text", "text": it.text}]
        return {"type": "reasoning", "id": f"rs_{it.id}", "summary": [], "content": content}
    return {
        "type": "function_call",
        "id": f"fc_{it.id}",
        "status": status,
        "call_id": it.call_id,
        "name": it.name,
        "arguments": it.text,
    }
