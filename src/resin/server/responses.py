"""POST /v1/responses (OpenAI Responses API), stream and not.

Stream order (SERVING.md): response.created -> response.in_progress -> per output item
(reasoning, message, function_call, in the order the model produced them): output_item.added
-> content events -> output_item.done -> exactly one of response.completed | incomplete |
failed. Item ids in the stream equal those of the final response.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any, Literal

from fastapi import APIRouter, Request
from starlette.responses import JSONResponse, Response

from resin.recipe.deltas import Delta, ReasoningDelta, TextDelta, ToolCallArgsDelta, ToolCallStart
from resin.server.asgi import SSEResponse, sse, until_disconnect
from resin.server.chat_setup import ChatSetup, Sampling, start_chat
from resin.server.errors import ApiError
from resin.server.generation import Finish, Generation, Update
from resin.server.responses_input import ResponsesRequest, input_items, to_messages, tools_of
from resin.server.service import Service
from resin.server.structured import responses_format
from resin.server.tool_choice import openai_choice

router = APIRouter()


@router.post("/v1/responses", response_model=None)
async def create_response(body: ResponsesRequest, request: Request) -> Response:
    svc: Service = request.app.state.service
    svc.check_model(body.model)
    inputs = input_items(body.input)
    if body.previous_response_id:
        prior = svc.responses.get(body.previous_response_id, "previous_response_id")
        inputs = [*prior.conversation, *inputs]
        body = body.model_copy(update={"input": inputs})
    _, (gen,) = await start_chat(svc, request, lambda: setup(body))
    builder = ResponseBuilder(svc, body)
    if body.store is not False:
        builder.on_done = lambda response: svc.responses.put(response, inputs)
    if body.stream:
        return SSEResponse(builder.stream(gen), on_close=gen.cancel, error_frame=builder.failed)
    return JSONResponse(await until_disconnect(request, builder.collect(gen)))


@router.get("/v1/responses/{response_id}", response_model=None)
async def get_response(response_id: str, request: Request) -> JSONResponse:
    svc: Service = request.app.state.service
    return JSONResponse(svc.responses.get(response_id).response)


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
        Sampling(body.temperature, body.top_p),
        responses_format(body.text),
    )


class ResponseBuilder:
    """Tracks output items while deltas arrive; renders stream events or the final object."""

    def __init__(self, svc: Service, body: ResponsesRequest) -> None:
        self.svc = svc
        self.body = body
        self.id = f"resp_{uuid.uuid4().hex}"
        self.created_at = int(time.time())
        self.items: list[dict[str, Any]] = []
        self.kind: Literal["reasoning", "message", "function_call"] | None = None
        self.seq = 0
        self.call_items: dict[int, int] = {}
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
        error = None
        if status == "failed":
            error = {"code": "server_error", "message": finish.error if finish else "failed"}
        return {
            "id": self.id,
            "object": "response",
            "created_at": self.created_at,
            "status": status,
            "model": self.svc.model,
            "output": self.items,
            "usage": usage,
            "error": error,
            "incomplete_details": incomplete,
            "instructions": self.body.instructions,
            "metadata": self.body.metadata or {},
            "parallel_tool_calls": True,
            "tool_choice": self.body.tool_choice or "auto",
            "tools": self.body.tools or [],
            "temperature": self.body.temperature,
            "top_p": self.body.top_p,
            "max_output_tokens": self.body.max_output_tokens,
            "text": self.body.text or {"format": {"type": "text"}},
            "reasoning": self.body.reasoning,
            "previous_response_id": self.body.previous_response_id,
            "store": self.body.store is not False,
        }

    def event(self, kind: str, **fields: Any) -> str:
        self.seq += 1
        return sse({"type": kind, "sequence_number": self.seq - 1, **fields}, event=kind)

    # ---- item bookkeeping ------------------------------------------------------------
    def _open(
        self, kind: Literal["reasoning", "message", "function_call"], **extra: Any
    ) -> Iterator[str]:
        yield from self._close()
        index = len(self.items)
        item: dict[str, Any]
        if kind == "message":
            item = {
                "type": "message",
                "id": f"msg_{uuid.uuid4().hex}",
                "status": "in_progress",
                "role": "assistant",
                "content": [],
            }
        elif kind == "reasoning":
            item = {
                "type": "reasoning",
                "id": f"rs_{uuid.uuid4().hex}",
                "summary": [],
                "content": [],
            }
        else:
            item = {
                "type": "function_call",
                "id": f"fc_{uuid.uuid4().hex}",
                "status": "in_progress",
                "call_id": extra["call_id"],
                "name": extra["name"],
                "arguments": "",
            }
        self.items.append(item)
        self.kind = kind
        yield self.event(
            "response.output_item.added",
            output_index=index,
            item=dict(item, content=[]) if kind != "function_call" else dict(item),
        )
        if kind == "message":
            part: dict[str, Any] = {
                "type": "output_text",
                "text": "",
                "annotations": [],
                "logprobs": [],
            }
            item["content"] = [part]
            yield self.event(
                "response.content_part.added",
                item_id=item["id"],
                output_index=index,
                content_index=0,
                part=dict(part),
            )
        elif kind == "reasoning":
            item["content"] = [{"type": "reasoning_text", "text": ""}]

    def _close(self) -> Iterator[str]:
        if self.kind is None:
            return
        index = len(self.items) - 1
        item = self.items[index]
        iid = item["id"]
        if self.kind == "message":
            part = item["content"][0]
            yield self.event(
                "response.output_text.done",
                item_id=iid,
                output_index=index,
                content_index=0,
                text=part["text"],
                logprobs=[],
            )
            yield self.event(
                "response.content_part.done",
                item_id=iid,
                output_index=index,
                content_index=0,
                part=part,
            )
            item["status"] = "completed"
        elif self.kind == "reasoning":
            yield self.event(
                "response.reasoning_text.done",
                item_id=iid,
                output_index=index,
                content_index=0,
                text=item["content"][0]["text"],
            )
        else:
            yield self.event(
                "response.function_call_arguments.done",
                item_id=iid,
                output_index=index,
                arguments=item["arguments"],
                name=item["name"],
            )
            item["status"] = "completed"
        self.kind = None
        yield self.event("response.output_item.done", output_index=index, item=item)

    def _apply(self, d: Delta) -> Iterator[str]:
        if isinstance(d, ToolCallStart):
            yield from self._open("function_call", call_id=d.id, name=d.name)
            self.call_items[d.index] = len(self.items) - 1
            return
        if isinstance(d, ToolCallArgsDelta):
            index = self.call_items.get(d.index)
            if index is None or index != len(self.items) - 1 or self.kind != "function_call":
                return
            item = self.items[index]
            item["arguments"] += d.fragment
            yield self.event(
                "response.function_call_arguments.delta",
                item_id=item["id"],
                output_index=index,
                delta=d.fragment,
            )
            return
        if isinstance(d, TextDelta | ReasoningDelta):
            kind: Literal["reasoning", "message"] = (
                "message" if isinstance(d, TextDelta) else "reasoning"
            )
            if not d.text:
                return
            if self.kind != kind:
                yield from self._open(kind)
            index = len(self.items) - 1
            item = self.items[index]
            item["content"][0]["text"] += d.text
            name = (
                "response.output_text.delta"
                if kind == "message"
                else "response.reasoning_text.delta"
            )
            extra: dict[str, Any] = {"logprobs": []} if kind == "message" else {}
            yield self.event(
                name, item_id=item["id"], output_index=index, content_index=0, delta=d.text, **extra
            )

    def _end(self, finish: Finish) -> Iterator[str]:
        yield from self._close()
        status = {"length": "incomplete", "error": "failed", "abort": "failed"}.get(
            finish.reason, "completed"
        )
        final = self.response(status, finish)
        if status != "failed" and self.on_done is not None:
            self.on_done(final)
        yield self.event(f"response.{status}", response=final)

    def failed(self, message: str) -> str:
        """`response.failed` for an answer cut off outside the engine (a too-slow reader)."""
        finish = Finish("error", 0, 0, 0, message)
        return self.event("response.failed", response=self.response("failed", finish))

    # ---- the two answers -------------------------------------------------------------
    async def stream(self, gen: Generation) -> AsyncIterator[str]:
        yield self.event("response.created", response=self.response("in_progress"))
        yield self.event("response.in_progress", response=self.response("in_progress"))
        async for up in gen.updates():
            for frame in self._frames(up):
                yield frame

    def _frames(self, up: Update) -> Iterator[str]:
        for d in up.deltas:
            yield from self._apply(d)
        if up.finish is not None:
            yield from self._end(up.finish)

    async def collect(self, gen: Generation) -> dict[str, Any]:
        final: dict[str, Any] = {}
        async for up in gen.updates():
            for _ in self._frames(up):
                pass
            if up.finish is not None:
                if up.finish.reason in ("abort", "error"):
                    raise ApiError(503, up.finish.error or "generation failed")
                status = "incomplete" if up.finish.reason == "length" else "completed"
                final = self.response(status, up.finish)
        return final
