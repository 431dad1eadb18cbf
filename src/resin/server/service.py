"""What every route needs: the actor, the chat format, the tokenizer, limits and metrics.

`Service.launch` is the one way a route starts generations: it takes the reservations made
before tokenizing, clamps `max_tokens` to the context, submits `n` engine requests and waits
for their first batch (so an engine refusal becomes an HTTP error before any stream starts).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

from resin.params import SamplingParams
from resin.recipe.tool_choice import ToolChoice, UnsupportedToolChoice
from resin.server.actor import EngineActor, EngineUnavailable, QueueFull, Reservation
from resin.server.errors import ApiError
from resin.server.generation import Finish, Generation
from resin.server.generation_defaults import NO_DEFAULTS, GenerationDefaults
from resin.server.metrics import ServerMetrics
from resin.server.ports import (
    ChatFormat,
    ChatTurn,
    OutputParser,
    RenderedPrompt,
    TokenizerLike,
    ToolSpec,
)
from resin.server.structured import NONE, Structured, name_field


@dataclass(frozen=True, slots=True)
class Limits:
    max_stop_strings: int = 16
    max_stop_chars: int = 256
    retry_after_s: int = 1


class Service:
    def __init__(
        self,
        actor: EngineActor,
        chat: ChatFormat,
        tokenizer: TokenizerLike,
        model: str,
        context_length: int,
        stream_interval: int,
        metrics: ServerMetrics,
        limits: Limits = Limits(),
        defaults: GenerationDefaults = NO_DEFAULTS,
    ) -> None:
        self.actor = actor
        self.chat = chat
        self.tokenizer = tokenizer
        self.model = model
        self.context_length = context_length
        self.stream_interval = stream_interval
        self.metrics = metrics
        self.limits = limits
        self.defaults = defaults
        """The checkpoint's sampling defaults for omitted fields (`generation_defaults.py`)."""
        self.started = int(time.time())

    def reserve(self, n: int = 1) -> list[Reservation]:
        """Intake slots for `n` requests, taken before any tokenizing (429 / 503 otherwise)."""
        held: list[Reservation] = []
        try:
            for _ in range(n):
                held.append(self.actor.reserve())
        except QueueFull as exc:
            release(held)
            self.metrics.rejected.labels("429").inc()
            headers = {"Retry-After": str(self.limits.retry_after_s)}
            raise ApiError(429, f"server busy: {exc}", headers=headers) from None
        except EngineUnavailable as exc:
            release(held)
            self.metrics.rejected.labels("503").inc()
            raise ApiError(503, f"engine unavailable: {exc}") from None
        return held

    def render(
        self,
        turns: Sequence[ChatTurn],
        tools: Sequence[ToolSpec],
        thinking: bool | None,
        tool_choice: ToolChoice | None = None,
    ) -> RenderedPrompt:
        """The prompt for a conversation; a conversation the recipe or template cannot render
        (a template's `raise_exception`, malformed tool-call arguments) is the client's 400, and
        so is a forced `tool_choice` the chat format cannot force."""
        try:
            if tool_choice is None:
                return self.chat.render(turns, tools, thinking)
            return self.chat.render(turns, tools, thinking, tool_choice=tool_choice)
        except UnsupportedToolChoice as exc:
            raise ApiError(400, str(exc), "tool_choice") from None
        except Exception as exc:
            raise ApiError(400, f"cannot render this conversation: {exc}", "messages") from None

    def check_model(self, name: str | None) -> None:
        # Clients often send a placeholder; only a clearly different name is an error.
        if name and name != self.model and name not in ("default", "resin"):
            raise ApiError(404, f"model {name!r} not found; this server serves {self.model!r}")

    def check_stops(self, stops: Sequence[str]) -> None:
        if len(stops) > self.limits.max_stop_strings:
            raise ApiError(400, f"at most {self.limits.max_stop_strings} stop strings", "stop")
        if any(len(s) > self.limits.max_stop_chars for s in stops):
            raise ApiError(400, f"stop strings are at most {self.limits.max_stop_chars}", "stop")

    def params(
        self,
        prompt_len: int,
        max_tokens: int | None,
        *,
        stop_token_ids: Sequence[int] = (),
        temperature: float | None = None,
        top_p: float | None = None,
        top_k: int | None = None,
        min_p: float | None = None,
        seed: int | None = None,
        logprobs: int | None = None,
        prompt_logprobs: int | None = None,
        min_tokens: int = 0,
        ignore_eos: bool = False,
    ) -> SamplingParams:
        """SamplingParams with `max_tokens` clamped to what the context has left; omitted
        fields take the checkpoint's generation defaults, then the server's."""
        d = self.defaults
        max_tokens = d.max_tokens if max_tokens is None else max_tokens
        temperature = d.temperature if temperature is None else temperature
        top_p = d.top_p if top_p is None else top_p
        top_k = d.top_k if top_k is None else top_k
        min_p = d.min_p if min_p is None else min_p
        room = self.context_length - prompt_len
        if room < 1:
            raise ApiError(
                400,
                f"prompt has {prompt_len} tokens; the context holds {self.context_length} "
                "(prompt plus at least one generated token)",
                "messages",
            )
        max_out = room if max_tokens is None else min(max_tokens, room)
        try:
            return SamplingParams(
                max_output_tokens=max_out,
                stop_token_ids=tuple(stop_token_ids),
                temperature=1.0 if temperature is None else temperature,
                top_p=1.0 if top_p is None else top_p,
                # top_k >= vocabulary is no top-k at all; mapping it to 0 also keeps huge
                # values out of the engine's int32 sampling arrays.
                top_k=0 if top_k is None or not 0 < top_k < self.tokenizer.vocab_size else top_k,
                min_p=0.0 if min_p is None else min_p,
                seed=seed,
                logprobs=logprobs,
                prompt_logprobs=prompt_logprobs,
                min_output_tokens=min(min_tokens, max_out),
                ignore_stop_tokens=ignore_eos,
            )
        except ValueError as exc:
            raise ApiError(400, str(exc)) from None

    async def launch(
        self,
        reservations: list[Reservation],
        prompt: Sequence[int],
        params: SamplingParams,
        parser: Callable[[], OutputParser],
        stops: Sequence[str] = (),
        structured: Structured = NONE,
    ) -> list[Generation]:
        """Submit one engine request per reservation (seed + i for choice i); an engine
        refusal of the constraint or bias is a 400 naming the field (`structured`)."""
        gens: list[Generation] = []
        ids = tuple(prompt)
        for i, res in enumerate(reservations):
            p = params if params.seed is None or i == 0 else replace(params, seed=params.seed + i)
            stream = self.actor.submit(res, ids, p)
            gens.append(
                Generation(
                    self.actor,
                    stream,
                    len(ids),
                    parser(),
                    stops,
                    self.stream_interval,
                    on_finish=self._observe,
                )
            )
        try:
            for gen in gens:
                await gen.start()
        except BaseException as exc:
            for gen in gens:
                gen.cancel()
            if isinstance(exc, ApiError):
                raise name_field(exc, structured) from None
            raise
        return gens

    def _observe(self, finish: Finish, ttft: float | None, e2e: float) -> None:
        self.metrics.observe(
            finish.reason,
            finish.prompt_tokens,
            finish.completion_tokens,
            finish.cached_tokens,
            ttft,
            e2e,
        )

    def token_text(self, token_id: int) -> str:
        return self.tokenizer.decode([token_id], False)


def release(reservations: list[Reservation]) -> None:
    for r in reservations:
        r.release()
