"""POST /v1/chat/completions: stream and not, n, stop strings, logprobs, tools, reasoning."""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator, Sequence
from typing import Any

from fastapi import APIRouter, Request
from starlette.responses import JSONResponse, Response

from resin.recipe.deltas import ReasoningDelta, TextDelta, ToolCallArgsDelta, ToolCallStart
from resin.recipe.types import Block, Message, Reasoning, Text, ToolCall, ToolDef, ToolResult
from resin.server.asgi import SSEResponse, sse, until_disconnect
from resin.server.chat_setup import ChatSetup, Sampling, start_chat
from resin.server.errors import ApiError
from resin.server.generation import (
    Finish,
    TokenLogprob,
    Update,
)
from resin.server.intake import Batch
from resin.server.schemas_openai import ChatCompletionRequest, ChatMessageIn, ContentPart
from resin.server.service import Service
from resin.server.structured import openai_fields
from resin.server.text import parts_text
from resin.server.tool_choice import openai_choice

router = APIRouter()


def message_text(content: str | list[ContentPart] | None, where: str) -> str:
    return parts_text(content, where, ("text", "input_text", "output_text"))


def to_messages(messages: Sequence[ChatMessageIn]) -> list[Message]:
    out = []
    for i, m in enumerate(messages):
        role = "system" if m.role == "developer" else m.role
        text = message_text(m.content, f"messages.{i}.content")
        blocks: list[Block] = []
        if role == "tool":
            blocks.append(ToolResult(m.tool_call_id or "", text))
        else:
            blocks += [Reasoning(m.reasoning_content)] if m.reasoning_content else []
            blocks += [Text(text)] if text else []
            blocks += [
                ToolCall(c.id, c.function.name, c.function.arguments) for c in m.tool_calls or ()
            ]
        out.append(Message(role, blocks))
    return out


def tools_of(body: ChatCompletionRequest) -> list[ToolDef]:
    if not body.tools or body.tool_choice == "none":
        return []
    return [
        ToolDef(t.function.name, t.function.description or None, t.function.parameters)
        for t in body.tools
    ]


def setup(body: ChatCompletionRequest) -> ChatSetup:
    tools = tools_of(body)
    sampling = Sampling(
        body.temperature,
        body.top_p,
        body.top_k,
        body.min_p,
        body.seed,
        (body.top_logprobs or 0) if body.logprobs else None,
        body.min_tokens,
        body.ignore_eos,
    )
    return ChatSetup(
        to_messages(body.messages),
        tools,
        openai_choice(body.tool_choice, tools),
        enable_thinking(body),
        body.max_completion_tokens or body.max_tokens,
        sampling,
        openai_fields(body),
        body.logit_bias,
        body.continue_final_message,
    )


def enable_thinking(body: ChatCompletionRequest) -> bool | None:
    kwargs = body.chat_template_kwargs or {}
    if "enable_thinking" in kwargs:
        return bool(kwargs["enable_thinking"])
    if body.reasoning_effort is not None:
        return body.reasoning_effort not in ("none", "minimal")
    return None


def usage(finishes: Sequence[Finish]) -> dict[str, Any]:
    prompt = finishes[0].prompt_tokens if finishes else 0
    completion = sum(f.completion_tokens for f in finishes)
    cached = max((f.cached_tokens for f in finishes), default=0)
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
        "prompt_tokens_details": {"cached_tokens": cached},
    }


def logprob_entries(svc: Service, items: Sequence[TokenLogprob]) -> list[dict[str, Any]]:
    out = []
    for item in items:
        text = svc.token_text(item.token_id)
        tops = [
            {
                "token": (t := svc.token_text(top.token_id)),
                "logprob": top.logprob,
                "bytes": list(t.encode()),
            }
            for top in item.top
        ]
        out.append(
            {
                "token": text,
                "logprob": item.logprob,
                "bytes": list(text.encode()),
                "top_logprobs": tops,
            }
        )
    return out


def finish_name(finish: Finish, has_tools: bool) -> str:
    if finish.reason == "stop" and has_tools:
        return "tool_calls"
    return finish.reason


def truncated(finishes: Sequence[Finish]) -> None:
    """A non-streamed answer with a cut-off choice is a 503, never a `stop`."""
    for f in finishes:
        if f.reason in ("abort", "error"):
            raise ApiError(503, f.error or "generation failed; retry")


def openai_stream_error(finish: Finish) -> str:
    message = finish.error or "generation failed; retry"
    return sse(
        {"error": {"message": message, "type": "server_error", "code": "service_unavailable"}}
    )


@router.post("/v1/chat/completions", response_model=None)
async def chat_completions(body: ChatCompletionRequest, request: Request) -> Response:
    svc: Service = request.app.state.service
    svc.check_model(body.model)
    _, gens = await start_chat(svc, request, lambda: setup(body), body.n, body.stop_strings())
    rid = f"chatcmpl-{uuid.uuid4().hex}"
    if body.stream:
        include_usage = bool(body.stream_options and body.stream_options.include_usage)
        stream = _stream(svc, gens, rid, body.logprobs, include_usage)
        return SSEResponse(stream, on_close=gens.cancel)
    return JSONResponse(await until_disconnect(request, _collect(svc, gens, rid, body.logprobs)))


async def _collect(svc: Service, gens: Batch, rid: str, want_logprobs: bool) -> dict[str, Any]:
    texts = [""] * len(gens)
    reasoning = [""] * len(gens)
    calls: list[dict[int, dict[str, Any]]] = [{} for _ in gens]
    lps: list[list[TokenLogprob]] = [[] for _ in gens]
    finishes: list[Finish | None] = [None] * len(gens)
    async for i, up in gens.updates():
        for d in up.deltas:
            if isinstance(d, TextDelta):
                texts[i] += d.text
            elif isinstance(d, ReasoningDelta):
                reasoning[i] += d.text
            elif isinstance(d, ToolCallStart):
                calls[i][d.index] = {
                    "id": d.id,
                    "type": "function",
                    "function": {"name": d.name, "arguments": ""},
                }
            elif isinstance(d, ToolCallArgsDelta):
                calls[i][d.index]["function"]["arguments"] += d.fragment
        lps[i].extend(up.logprobs)
        finishes[i] = up.finish or finishes[i]
    done = [f for f in finishes if f is not None]
    truncated(done)
    choices = []
    for i, f in enumerate(finishes):
        assert f is not None
        message: dict[str, Any] = {"role": "assistant", "content": texts[i] or None}
        if reasoning[i]:
            message["reasoning_content"] = reasoning[i]
        if calls[i]:
            message["tool_calls"] = [calls[i][k] for k in sorted(calls[i])]
        choices.append(
            {
                "index": i,
                "message": message,
                "logprobs": {"content": logprob_entries(svc, lps[i])} if want_logprobs else None,
                "finish_reason": finish_name(f, bool(calls[i])),
            }
        )
    return {
        "id": rid,
        "object": "chat.completion",
        "created": int(time.time()),
        "model": svc.model,
        "choices": choices,
        "usage": usage(done),
    }


async def _stream(
    svc: Service, gens: Batch, rid: str, want_logprobs: bool, include_usage: bool
) -> AsyncIterator[str]:
    created = int(time.time())
    base = {"id": rid, "object": "chat.completion.chunk", "created": created, "model": svc.model}
    sent_role = [False] * len(gens)
    has_calls = [False] * len(gens)
    finishes: list[Finish] = []
    async for i, up in gens.updates():
        delta = _delta(up, sent_role[i], has_calls, i)
        sent_role[i] = True
        finish = None
        if up.finish is not None:
            finishes.append(up.finish)
            finish = finish_name(up.finish, has_calls[i])
            if up.finish.reason in ("abort", "error"):
                # Truncated: an error event and no [DONE]; never a finish_reason of "stop".
                yield openai_stream_error(up.finish)
                return
        choice: dict[str, Any] = {
            "index": i,
            "delta": delta,
            "logprobs": None,
            "finish_reason": finish,
        }
        if want_logprobs and up.logprobs:
            choice["logprobs"] = {"content": logprob_entries(svc, up.logprobs)}
        yield sse({**base, "choices": [choice]})
    if include_usage:
        yield sse({**base, "choices": [], "usage": usage(finishes)})
    yield sse("[DONE]")


def _delta(up: Update, sent_role: bool, has_calls: list[bool], i: int) -> dict[str, Any]:
    delta: dict[str, Any] = {} if sent_role else {"role": "assistant"}
    text = "".join(d.text for d in up.deltas if isinstance(d, TextDelta))
    thought = "".join(d.text for d in up.deltas if isinstance(d, ReasoningDelta))
    if text or not sent_role:
        delta["content"] = text
    if thought:
        delta["reasoning_content"] = thought
    calls: list[dict[str, Any]] = []
    for d in up.deltas:
        if isinstance(d, ToolCallStart):
            has_calls[i] = True
            calls.append(
                {
                    "index": d.index,
                    "id": d.id,
                    "type": "function",
                    "function": {"name": d.name, "arguments": ""},
                }
            )
        elif isinstance(d, ToolCallArgsDelta):
            calls.append({"index": d.index, "function": {"arguments": d.fragment}})
    if calls:
        delta["tool_calls"] = calls
    return delta
