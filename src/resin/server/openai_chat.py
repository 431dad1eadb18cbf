"""POST /v1/chat/completions: stream and not, n, stop strings, logprobs, tools, reasoning."""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncGenerator, Callable, Sequence
from typing import Any

from fastapi import APIRouter, Request
from starlette.responses import JSONResponse, Response

from resin.frontend.generation import Finish, TokenLogprob, Update
from resin.frontend.intake import Generations
from resin.recipe.deltas import (
    Delta,
    ReasoningDelta,
    TextDelta,
    ToolCallArgsDelta,
    ToolCallStart,
)
from resin.recipe.types import Block, Message, Reasoning, Text, ToolCall, ToolDef, ToolResult
from resin.server.asgi import SSEResponse, openai_error_frame, sse, until_disconnect
from resin.server.chat_setup import ChatSetup, start_chat
from resin.server.items import Items
from resin.server.media import openai_blocks
from resin.server.schemas_openai import (
    ChatCompletionRequest,
    ChatMessageIn,
    ContentPart,
    SamplingFields,
)
from resin.server.service import Sampling, Service
from resin.server.structured import openai_fields
from resin.server.text import call_arguments, parts_text
from resin.server.tool_choice import openai_choice
from resin.server.unsupported import CHAT, refuse_unsupported

router = APIRouter()


def message_text(content: str | list[ContentPart] | None, where: str) -> str:
    return parts_text(content, where, ("text", "input_text", "output_text"))


def to_messages(messages: Sequence[ChatMessageIn]) -> list[Message]:
    out = []
    for i, m in enumerate(messages):
        role = "system" if m.role == "developer" else m.role
        where, at = f"messages.{i}.content", f"messages.{i}.tool_calls"
        images = openai_blocks(m.content, where) if isinstance(m.content, list) else None
        if images is not None and role == "user":
            out.append(Message(role, images))
            continue
        text = message_text(m.content, where)
        blocks: list[Block] = []
        if role == "tool":
            blocks.append(ToolResult(m.tool_call_id or "", text))
        else:
            blocks += [Reasoning(m.reasoning_content)] if m.reasoning_content else []
            blocks += [Text(text)] if text else []
            blocks += [
                ToolCall(
                    c.id,
                    c.function.name,
                    call_arguments(c.function.arguments, f"{at}.{j}.function"),
                )
                for j, c in enumerate(m.tool_calls or ())
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


def sampling_of(
    body: SamplingFields, logprobs: int | None, prompt_logprobs: int | None = None
) -> Sampling:
    """The sampling fields chat and completions share, with the route's logprobs."""
    return {**body.sampling(), "logprobs": logprobs, "prompt_logprobs": prompt_logprobs}


def setup(body: ChatCompletionRequest) -> ChatSetup:
    tools = tools_of(body)
    sampling = sampling_of(body, (body.top_logprobs or 0) if body.logprobs else None)
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
    """`logprobs.content` for generated tokens; the end-of-turn token that stopped the answer
    is left out, as it is out of `message.content` (OpenAI lists the content's tokens)."""

    def entry(token_id: int, logprob: float) -> dict[str, Any]:
        text = svc.token_text(token_id)
        return {"token": text, "logprob": logprob, "bytes": list(text.encode())}

    stops = frozenset(svc.recipe.stop_token_ids)
    return [
        {
            **entry(i.token_id, i.logprob),
            "top_logprobs": [entry(t.token_id, t.logprob) for t in i.top],
        }
        for i in items
        if i.token_id not in stops
    ]


def finish_name(finish: Finish, has_tools: bool) -> str:
    if finish.reason == "stop" and has_tools:
        return "tool_calls"
    return finish.reason


async def openai_sse(
    gens: Generations,
    base: dict[str, Any],
    choice: Callable[[int, Update], dict[str, Any]],
    include_usage: bool,
) -> AsyncGenerator[str, None]:
    """OpenAI's chunk stream (chat and completions): a chunk per update with `choice(i,
    update)`, the usage chunk when asked, `[DONE]`. A choice cut off ends the stream with an
    error event and no `[DONE]`: never a finish_reason of "stop"."""
    finishes: list[Finish] = []
    async for i, up in gens.updates():
        chunk = {**base, "choices": [choice(i, up)]}
        if up.finish is not None:
            finishes.append(up.finish)
            if up.finish.failed:
                yield openai_error_frame(up.finish.error or "generation failed; retry")
                return
        yield sse(chunk)
    if include_usage:
        yield sse({**base, "choices": [], "usage": usage(finishes)})
    yield sse("[DONE]")


@router.post("/v1/chat/completions", response_model=None)
async def chat_completions(body: ChatCompletionRequest, request: Request) -> Response:
    svc: Service = request.app.state.service
    svc.check_model(body.model)
    refuse_unsupported(body, CHAT)
    _, gens = await start_chat(svc, request, lambda: setup(body), body.n, body.stop_strings(), body)
    rid = f"chatcmpl-{uuid.uuid4().hex}"
    if body.stream:
        include_usage = bool(body.stream_options and body.stream_options.include_usage)
        base = {"id": rid, "object": "chat.completion.chunk", "created": int(time.time())}
        base["model"] = svc.model
        choice = _chunks(svc, len(gens), body.logprobs)
        return SSEResponse(openai_sse(gens, base, choice, include_usage), on_close=gens.cancel)
    return JSONResponse(await until_disconnect(request, _collect(svc, gens, rid, body.logprobs)))


async def _collect(
    svc: Service, gens: Generations, rid: str, want_logprobs: bool
) -> dict[str, Any]:
    answers = await gens.collect()
    choices = []
    for i, up in enumerate(answers):
        assert up.finish is not None
        items = Items().add(up.deltas)
        calls = [
            {"id": c.call_id, "type": "function", "function": {"name": c.name, "arguments": c.text}}
            for c in items.of("tool_call")
        ]
        text = items.text("text")
        # null only beside tool calls (OpenAI's shape); an empty answer is ""
        message: dict[str, Any] = {"role": "assistant", "content": text or (None if calls else "")}
        if reasoning := items.text("reasoning"):
            message["reasoning_content"] = reasoning
        if calls:
            message["tool_calls"] = calls
        choices.append(
            {
                "index": i,
                "message": message,
                "logprobs": {"content": logprob_entries(svc, up.logprobs)}
                if want_logprobs
                else None,
                "finish_reason": finish_name(up.finish, bool(calls)),
            }
        )
    return {
        "id": rid,
        "object": "chat.completion",
        "created": int(time.time()),
        "model": svc.model,
        "choices": choices,
        "usage": usage([up.finish for up in answers if up.finish is not None]),
    }


def _chunks(svc: Service, n: int, want_logprobs: bool) -> Callable[[int, Update], dict[str, Any]]:
    """The chunk choice of each update: the role first, then content, reasoning and tool-call
    pieces; the finish reason names tool calls when the choice made any."""
    sent_role = [False] * n
    has_calls = [False] * n

    def choice(i: int, up: Update) -> dict[str, Any]:
        delta: dict[str, Any] = {} if sent_role[i] else {"role": "assistant"}
        text = "".join(d.text for d in up.deltas if isinstance(d, TextDelta))
        thought = "".join(d.text for d in up.deltas if isinstance(d, ReasoningDelta))
        if text or not sent_role[i]:
            delta["content"] = text
        if thought:
            delta["reasoning_content"] = thought
        calls = call_pieces(up.deltas)
        if calls:
            delta["tool_calls"] = calls
        sent_role[i] = True
        has_calls[i] = has_calls[i] or any(isinstance(d, ToolCallStart) for d in up.deltas)
        logprobs = None
        if want_logprobs and up.logprobs:
            logprobs = {"content": logprob_entries(svc, up.logprobs)}
        finish = None if up.finish is None else finish_name(up.finish, has_calls[i])
        return {"index": i, "delta": delta, "logprobs": logprobs, "finish_reason": finish}

    return choice


def call_pieces(deltas: Sequence[Delta]) -> list[dict[str, Any]]:
    """A chunk's `tool_calls` entries: one per call index (OpenAI's framing; clients such as
    instructor read only the first entry of an index), its start and argument fragments of
    this update merged, in the order the calls appeared."""
    pieces: dict[int, dict[str, Any]] = {}
    for d in deltas:
        if isinstance(d, ToolCallStart):
            function = {"name": d.name, "arguments": ""}
            pieces[d.index] = {
                "index": d.index,
                "id": d.id,
                "type": "function",
                "function": function,
            }
        elif isinstance(d, ToolCallArgsDelta):
            piece = pieces.setdefault(d.index, {"index": d.index, "function": {"arguments": ""}})
            piece["function"]["arguments"] += d.fragment
    return list(pieces.values())
