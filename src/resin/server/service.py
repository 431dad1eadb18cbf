"""What every route needs: the actor, the recipe, the tokenizer, limits and metrics.

A route reserves its intake slots first (`with svc.reserve(count, request) as ticket:`, before
any tokenizing, so an overloaded server refuses cheaply), renders or tokenizes off the event
loop (`await svc.render(...)`, `await svc.encode(...)`), then `launch`es its generations (one
prompt or several, n choices each) and reads them as one `Generations`. Every slot the route does
not hand to the actor is released when the `with` block ends, whatever happened inside it.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from starlette.requests import Request

from resin.frontend.actor import EngineActor
from resin.frontend.errors import EngineUnavailable, FrontendError, QueueFull
from resin.frontend.generation import Generation
from resin.frontend.intake import Generations, Ticket
from resin.frontend.ports import OutputParser
from resin.frontend.replicas import ReplicaSet
from resin.generation_config import NO_DEFAULTS, GenerationDefaults
from resin.params import SamplingParams, from_public
from resin.plan import MediaItem
from resin.recipe import Message, Recipe, RenderedPrompt, ToolCall, ToolDef
from resin.recipe.special_text import LiteralSpecials, texts
from resin.recipe.tool_choice import ToolChoice, UnsupportedToolChoice
from resin.server.asgi import until_disconnect
from resin.server.errors import ApiError, ClientDisconnected, api_error
from resin.server.logs import track
from resin.server.metrics import ServerMetrics
from resin.server.response_store import Responses, ResponseStore
from resin.server.structured import NONE, Structured, name_field
from resin.tokenizer import TokenizerLike

log = logging.getLogger("resin.server")


Sampling = Mapping[str, Any]
"""The sampling fields a body sent, by public name (`resin.params.PUBLIC`; None or absent takes
the checkpoint's default, then `SamplingParams`')."""


@dataclass(frozen=True, slots=True)
class Limits:
    max_stop_strings: int = 16
    max_stop_chars: int = 256
    retry_after_s: int = 1
    max_generations: int = 64
    """Engine requests one HTTP request may start (n x prompts)."""
    connection_share: float = 0.25
    """Fraction of the intake queue one client connection may hold at once."""
    max_chars_per_token: int = 64
    """Text longer than context_length * this is refused before it is tokenized."""
    stall_timeout_s: float = 60.0
    """`/health` answers 503 `stalled` once an engine made no progress this long while work
    was queued or running."""


CACHE_KNOBS = "the server's KV cache size: --kv-cache-memory, --gpu-memory-utilization"


class Service:
    def __init__(
        self,
        actor: EngineActor | ReplicaSet,
        recipe: Recipe,
        tokenizer: TokenizerLike,
        model: str,
        context_length: int,
        stream_interval: int,
        metrics: ServerMetrics,
        limits: Limits = Limits(),
        special_tokens_in_text: bool = False,
        defaults: GenerationDefaults = NO_DEFAULTS,
        responses: Responses | None = None,
    ) -> None:
        self.actor = actor
        self.recipe = recipe
        self.tokenizer = tokenizer
        self.model = model
        self.context_length = context_length
        self.stream_interval = stream_interval
        self.metrics = metrics
        self.limits = limits
        self.literal = None if special_tokens_in_text else LiteralSpecials(tokenizer)
        self.defaults = defaults
        """The checkpoint's sampling defaults for omitted fields (`resin.generation_config`)."""
        self.started = int(time.time())
        self.responses: Responses = ResponseStore() if responses is None else responses
        """Stored Responses-API answers (`previous_response_id`, GET/DELETE)."""

    def reserve(self, n: int = 1, request: Request | None = None) -> Ticket:
        """Intake slots for `n` generations, taken before any tokenizing: 400 above the
        per-request cap, 429 when the queue (or this connection's share of it) is full, 503
        when the engine is gone. All or none are taken."""
        if n > self.limits.max_generations:
            raise ApiError(
                400,
                f"this request asks for {n} generations (n x prompts); "
                f"at most {self.limits.max_generations}",
                "n",
            )
        owner = _connection(request)
        share = max(1, int(self.actor.queue_capacity * self.limits.connection_share))
        if n > share:
            raise ApiError(400, f"at most {share} generations per connection at a time", "n")
        try:
            return Ticket(self.actor.reserve_many(n, owner, share))
        except (QueueFull, EngineUnavailable) as exc:
            error = api_error(exc, retry_after_s=self.limits.retry_after_s)
            self.metrics.rejected.labels(str(error.status)).inc()
            raise error from None

    def requested_replica(self, request: Request, body: object = None) -> int | None:
        """The data-parallel replica a client named (`routed_dp_rank` in the body, else the
        `resin-routed-dp-rank` header), or None; a 400 when this server has no such replica."""
        value = getattr(body, "routed_dp_rank", None)
        param = "routed_dp_rank"
        if value is None:
            value, param = request.headers.get("resin-routed-dp-rank"), "resin-routed-dp-rank"
        if value is None:
            return None
        count = len(self.actor.replicas)
        try:
            index = int(value)
        except (TypeError, ValueError):
            index = -1
        if isinstance(value, bool) or not 0 <= index < count:
            raise ApiError(400, f"{param} must be a replica index in [0, {count})", param)
        return index

    def check_text(self, texts: Sequence[str], param: str = "messages", messages: int = 0) -> None:
        """Refuse user text that cannot fit the context (before paying for its tokenization)
        or is not valid Unicode (a lone surrogate): a 400 naming `param`. The estimate is a
        lower bound: `max_chars_per_token` characters a token, one token a message."""
        chars = sum(len(t) for t in texts)
        if chars // self.limits.max_chars_per_token + messages > self.context_length:
            what = f"{chars} characters" + (f" in {messages} messages" if messages else "")
            message = f"a prompt of {what} cannot fit the context of {self.context_length} tokens"
            raise ApiError(400, message, param)
        for t in texts:
            try:
                t.encode("utf-8")
            except UnicodeEncodeError:
                raise ApiError(400, "text is not valid Unicode (lone surrogate)", param) from None

    async def encode(self, text: str) -> list[int]:
        """Tokenize a checked (`check_text`) prompt off the event loop."""
        return await asyncio.to_thread(self.tokenizer.encode, text, True)

    async def render(
        self,
        messages: Sequence[Message],
        tools: Sequence[ToolDef],
        thinking: bool | None,
        tool_choice: ToolChoice | None = None,
        continue_final: bool = False,
    ) -> RenderedPrompt:
        """The prompt for a conversation, rendered and tokenized off the event loop after a
        length check; a conversation the recipe or template cannot render (a template's
        `raise_exception`, malformed tool-call arguments) is the client's 400, and so is a
        forced `tool_choice` the recipe cannot force (both `ValueError`s); any other exception
        is a recipe bug: logged with its traceback, answered 500. `continue_final`: the model
        continues the last (assistant) message (`resin.recipe.prefill`)."""
        self.check_text(texts(messages), messages=len(messages))
        self.check_text(_structure_texts(messages, tools), "tools")
        return await asyncio.to_thread(
            self._render, messages, tools, thinking, tool_choice, continue_final
        )

    def _render(
        self,
        messages: Sequence[Message],
        tools: Sequence[ToolDef],
        thinking: bool | None,
        tool_choice: ToolChoice | None,
        continue_final: bool,
    ) -> RenderedPrompt:
        def render(ms: Sequence[Message], ts: Sequence[ToolDef]) -> RenderedPrompt:
            if continue_final:  # only then: a recipe need not know the option otherwise
                return self.recipe.render(
                    ms,
                    tools=list(ts) or None,
                    enable_thinking=thinking,
                    tool_choice=tool_choice,
                    continue_final_message=True,
                )
            return self.recipe.render(
                ms, tools=list(ts) or None, enable_thinking=thinking, tool_choice=tool_choice
            )

        try:
            if self.literal is None:
                return render(messages, tools)
            return self.literal.render(messages, tools, render)
        except UnsupportedToolChoice as exc:
            raise ApiError(400, str(exc), "tool_choice") from None
        except ValueError as exc:  # the documented client errors (`raise_exception`, bad JSON)
            raise ApiError(400, f"cannot render this conversation: {exc}", "messages") from None
        except Exception:  # a recipe bug: the client gets a 500, the log the traceback
            log.exception("recipe %r crashed rendering a conversation", self.recipe.name)
            raise

    def check_model(self, name: str | None) -> None:
        # Clients often send a placeholder; only a clearly different name is an error.
        if name and name != self.model and name not in ("default", "resin"):
            message = f"model {name!r} not found; this server serves {self.model!r}"
            raise ApiError(404, message, code="model_not_found")

    def check_stops(self, stops: Sequence[str]) -> None:
        if len(stops) > self.limits.max_stop_strings:
            raise ApiError(400, f"at most {self.limits.max_stop_strings} stop strings", "stop")
        if any(len(s) > self.limits.max_stop_chars for s in stops):
            raise ApiError(400, f"stop strings are at most {self.limits.max_stop_chars}", "stop")

    def params(
        self,
        prompt_len: int,
        max_tokens: int | None,
        sampling: Sampling,
        stop_token_ids: Sequence[int] = (),
    ) -> SamplingParams:
        """SamplingParams with `max_tokens` clamped to what the context has left; omitted
        fields take the checkpoint's generation defaults, then the server's."""
        max_tokens = self.defaults.get("max_tokens") if max_tokens is None else max_tokens
        room = self.context_length - prompt_len
        if room < 1:
            raise ApiError(
                400,
                f"prompt has {prompt_len} tokens; the context holds {self.context_length} "
                "(prompt plus at least one generated token; the server's --max-model-len, "
                "with a KV cache to match: --kv-cache-memory / --gpu-memory-utilization)",
                "messages",
            )
        max_out = room if max_tokens is None else min(max_tokens, room)
        values = from_public({**self.defaults.apply(sampling), "max_tokens": max_out})
        # top_k >= vocabulary (or vLLM's -1) is no top-k at all; mapping it to 0 also keeps
        # huge values out of the engine's int32 sampling arrays.
        top_k = values.get("top_k", 0)
        values["top_k"] = top_k if 0 < top_k < self.tokenizer.vocab_size else 0
        values["min_output_tokens"] = min(values.get("min_output_tokens", 0), max_out)
        try:
            return SamplingParams(**values, stop_token_ids=tuple(stop_token_ids))
        except ValueError as exc:
            raise ApiError(400, str(exc)) from None

    def choices(self, params: SamplingParams, n: int) -> list[SamplingParams]:
        """Per-choice params (seed + i for choice i); a seed range overflow is a 400."""
        if params.seed is None or n == 1:
            return [params] * n
        try:
            return [params if i == 0 else replace(params, seed=params.seed + i) for i in range(n)]
        except ValueError:
            raise ApiError(400, f"seed + n - 1 must be below 2**63 (n = {n})", "seed") from None

    async def launch(
        self,
        ticket: Ticket,
        runs: Sequence[tuple[Sequence[int], SamplingParams]],
        parser: Callable[[], OutputParser],
        stops: Sequence[str] = (),
        structured: Structured = NONE,
        media: Sequence[MediaItem] = (),
        replica: int | None = None,
        request: Request | None = None,
    ) -> Generations:
        """One generation per slot of `ticket`, shared evenly by `runs` (a prompt and its
        params; choice i of a prompt samples with seed + i). Everything that can fail (seeds,
        parsers, routing) runs before the first generation is handed to an actor; then all
        start together, and an engine refusal of the constraint or bias is a 400 naming the
        field. With data-parallel replicas each prompt is routed once (`replica`: the one the
        client named), so its `n` choices share one replica and its prefix cache.

        `request`: its connection is watched until every generation has its first events (a
        queued request waits here until the engine admits it); a client that leaves aborts its
        generations, and the actor drops an aborted request before it enters the engine (a
        burst of closed streams costs no prefill). A client already gone is not submitted."""
        if request is not None and await _gone(request):
            raise ClientDisconnected
        n = len(ticket) // len(runs)
        actors = [self._route(ids, media, replica) for ids, _ in runs]
        planned = [
            (actor, tuple(ids), p)
            for actor, (ids, params) in zip(actors, runs, strict=True)
            for p in self.choices(params, n)
        ]
        parsers = [parser() for _ in planned]
        gens = [
            Generation(
                actor,
                actor.submit(slot, ids, p, tuple(media)),
                len(ids),
                par,
                stops,
                self.stream_interval,
                on_finish=self.metrics.observe,
            )
            for slot, (actor, ids, p), par in zip(
                ticket.take(len(planned)), planned, parsers, strict=True
            )
        ]
        track(gens)
        batch = Generations(gens, self.actor.stream_capacity, [p for _, _, p in planned])
        try:
            if request is None:
                await batch.start()
            else:
                await until_disconnect(request, batch.start())
        except FrontendError as exc:  # an engine refusal of the constraint or bias: a 400
            error = api_error(exc)
            if "cache pages" in error.message:  # a prompt larger than the whole KV cache
                error.message += f" ({CACHE_KNOBS})"
            raise name_field(error, structured) from None
        return batch

    def _route(
        self, ids: Sequence[int], media: Sequence[MediaItem], replica: int | None
    ) -> EngineActor:
        try:
            return self.actor.route(ids, media, replica)
        except EngineUnavailable as exc:
            raise api_error(exc) from None

    def token_text(self, token_id: int) -> str:
        return self.tokenizer.decode([token_id], False)


def _structure_texts(messages: Sequence[Message], tools: Sequence[ToolDef]) -> list[str]:
    """Tool calls and tool definitions as rendered text, for the estimate before rendering."""
    calls = [
        f"{b.name}{b.arguments}" for m in messages for b in m.content if isinstance(b, ToolCall)
    ]
    return calls + [f"{t.name}{t.description or ''}{json.dumps(t.parameters)}" for t in tools]


def _connection(request: Request | None) -> object:
    """The client connection a request came on (its share of the queue is counted per
    connection); None when unknown."""
    if request is None:
        return None
    client = request.scope.get("client")
    return None if client is None else (client[0], client[1])


async def _gone(request: Request) -> bool:
    """Whether the client already left (an `http.disconnect` is waiting; never blocks)."""
    return await request.is_disconnected()
