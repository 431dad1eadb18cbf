"""One engine request seen from its reader (an HTTP handler): events in, typed updates out.

`Generation.updates()` turns the actor's event batches into `Update`s: parser deltas with stop
strings applied to the visible text (a partial match is held back), token ids with their
logprobs, and at the end one `Finish`. Leaving the iterator early (client gone, stop string
hit, handler error) aborts the engine request, so its pages are freed.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Literal

from resin.events import FinishedEvent, FinishReason, TokensEvent, TopLogprob
from resin.frontend.actor import EngineActor
from resin.frontend.errors import EngineUnavailable, QueueFull, RequestRefused
from resin.frontend.ports import OutputParser
from resin.frontend.stop_strings import StopMatcher
from resin.frontend.stream import RequestStream, StreamError
from resin.recipe.deltas import Delta, ReasoningDelta, TextDelta


@dataclass(frozen=True, slots=True)
class TokenLogprob:
    token_id: int
    logprob: float
    top: tuple[TopLogprob, ...] = ()


@dataclass(frozen=True, slots=True)
class Finish:
    reason: FinishReason
    """The engine's own finish vocabulary (a stop string hit is `stop`)."""
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int
    error: str | None = None

    @property
    def failed(self) -> bool:
        """Cut off (aborted or failed): never answered as a complete `stop`."""
        return self.reason in (FinishReason.ABORT, FinishReason.ERROR)


@dataclass(slots=True)
class Update:
    deltas: list[Delta] = field(default_factory=list)
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[TokenLogprob] = field(default_factory=list)
    prompt_logprobs: list[TokenLogprob] | None = None
    finish: Finish | None = None


class Generation:
    """Consumes one RequestStream. Use `async for update in gen.updates()` exactly once."""

    def __init__(
        self,
        actor: EngineActor,
        stream: RequestStream,
        prompt_len: int,
        parser: OutputParser,
        stops: Sequence[str] = (),
        stream_interval: int = 1,
        on_finish: Callable[[Finish, float | None, float], None] | None = None,
    ) -> None:
        self.actor = actor
        self.stream = stream
        self.prompt_len = prompt_len
        self.parser = parser
        self.stops = StopMatcher(stops)
        self.stream_interval = max(1, stream_interval)
        self.completion_tokens = 0
        self.cached_tokens = 0
        self.done = False
        self.on_finish = on_finish
        self.started_at = time.perf_counter()
        self.first_token_at: float | None = None
        self._first: list[TokensEvent | FinishedEvent] | None = None

    async def start(self) -> None:
        """Wait for the first batch so an engine refusal is an error (`RequestRefused`,
        `EngineUnavailable`) before anything was sent, not a stream."""
        item = await self.stream.get()
        if isinstance(item, StreamError):
            self.done = True
            kinds = {"refused": RequestRefused, "busy": QueueFull}
            raise kinds.get(item.kind, EngineUnavailable)(item.message)
        self._first = [e for e in item if isinstance(e, TokensEvent | FinishedEvent)]
        # The prefix-cache hit is known from the first events on: a stream's opening event
        # (Anthropic's message_start) reports it before any token is read.
        self.cached_tokens = max((e.cached_tokens for e in self._first), default=0)

    def cancel(self) -> None:
        """Abort the engine request unless it already finished (idempotent)."""
        if not self.done:
            self.done = True
            self.actor.abort(self.stream)

    async def updates(self) -> AsyncIterator[Update]:
        try:
            async for update in self._batches():
                yield update
        finally:
            self.cancel()

    async def _batches(self) -> AsyncIterator[Update]:
        """One update per batch the stream hands over: the first at once, then each once
        it holds `stream_interval` tokens or the end (`RequestStream.get` coalesces)."""
        batch = self._first
        self._first = None
        while True:
            if batch is None:
                item = await self.stream.get(self.stream_interval)
                if isinstance(item, StreamError):
                    yield self._finish_update([], FinishReason.ERROR, item.message)
                    return
                batch = [e for e in item if isinstance(e, TokensEvent | FinishedEvent)]
            update = Update()
            for event in batch:
                if isinstance(event, FinishedEvent):
                    reason = event.reason
                    error = event.error
                    if reason is FinishReason.ABORT:
                        error = error or self.stream.abort_reason or "the request was aborted"
                    merge(update, self._finish_update([], reason, error))
                    yield update
                    return
                # With stop strings, a speculative step's tokens are taken one at a time, so
                # a stop string inside them ends the output where one-token steps would.
                for part in _one_by_one(event) if self.stops.stops else (event,):
                    piece = self._on_tokens(part)
                    if self.stops.hit:
                        stop = self._finish_update(piece.deltas, FinishReason.STOP, None, piece)
                        merge(update, stop)
                        yield update
                        return
                    merge(update, piece)
            yield update
            batch = None

    def _on_tokens(self, event: TokensEvent) -> Update:
        self.completion_tokens += len(event.token_ids)
        if self.first_token_at is None and event.token_ids:
            self.first_token_at = time.perf_counter()
        self.cached_tokens = max(self.cached_tokens, event.cached_tokens)
        update = Update(token_ids=list(event.token_ids))
        update.deltas = self._visible(self.parser.feed(event.token_ids))
        if event.logprobs is not None:
            tops = event.top_logprobs or tuple(() for _ in event.token_ids)
            update.logprobs = [
                TokenLogprob(t, finite(lp), _finite_top(top))
                for t, lp, top in zip(event.token_ids, event.logprobs, tops, strict=False)
            ]
        if event.prompt_logprobs is not None:
            ptops = event.prompt_top_logprobs or tuple(() for _ in event.prompt_logprobs)
            update.prompt_logprobs = [
                TokenLogprob(-1, finite(lp), _finite_top(top))
                for lp, top in zip(event.prompt_logprobs, ptops, strict=False)
            ]
        return update

    def _visible(self, deltas: list[Delta]) -> list[Delta]:
        out: list[Delta] = []
        for d in deltas:
            if self.stops.hit:
                break
            if isinstance(d, TextDelta):
                text, _ = self.stops.push(d.text)
                if text:
                    out.append(TextDelta(text))
            else:
                out.append(d)
        return out

    def _finish_update(
        self,
        deltas: list[Delta],
        reason: FinishReason,
        error: str | None,
        base: Update | None = None,
    ) -> Update:
        update = base or Update()
        if not self.stops.hit:
            cut: Literal["stop", "length"] = "length" if reason == "length" else "stop"
            deltas = deltas + self._visible(list(self.parser.finish(cut).deltas))
            tail = self.stops.flush()
            if tail:
                deltas.append(TextDelta(tail))
        update.deltas = deltas
        if self.stops.hit:
            reason = FinishReason.STOP
            self.actor.abort(self.stream)
        self.done = True
        update.finish = Finish(
            reason, self.prompt_len, self.completion_tokens, self.cached_tokens, error
        )
        if self.on_finish is not None:
            now = time.perf_counter()
            ttft = None if self.first_token_at is None else self.first_token_at - self.started_at
            self.on_finish(update.finish, ttft, now - self.started_at)
        return update


LOGPROB_FLOOR = -9999.0
"""The logprob of an impossible token (one a grammar mask forbids: -inf in the runner), as
vLLM reports it: every logprob is a finite number, so answers are strictly valid JSON."""


def finite(logprob: float) -> float:
    """`logprob` floored at `LOGPROB_FLOOR` (-inf and NaN included)."""
    return logprob if logprob >= LOGPROB_FLOOR else LOGPROB_FLOOR


def _finite_top(top: Sequence[TopLogprob]) -> tuple[TopLogprob, ...]:
    if all(t.logprob >= LOGPROB_FLOOR for t in top):
        return tuple(top)
    return tuple(TopLogprob(t.token_id, finite(t.logprob)) for t in top)


def _one_by_one(event: TokensEvent) -> list[TokensEvent]:
    """A multi-token event as one event per token (the first keeps the prompt logprobs)."""
    if len(event.token_ids) <= 1:
        return [event]
    return [
        replace(
            event,
            token_ids=(tok,),
            logprobs=None if event.logprobs is None else (event.logprobs[j],),
            top_logprobs=None if event.top_logprobs is None else (event.top_logprobs[j],),
            prompt_logprobs=event.prompt_logprobs if j == 0 else None,
            prompt_top_logprobs=event.prompt_top_logprobs if j == 0 else None,
        )
        for j, tok in enumerate(event.token_ids)
    ]


def merge(into: Update, new: Update) -> None:
    for delta in new.deltas:
        # Adjacent text (or reasoning) pieces become one delta, so a stream interval of k tokens
        # sends one SSE event per k tokens, not one per token.
        last = into.deltas[-1] if into.deltas else None
        if isinstance(delta, TextDelta) and isinstance(last, TextDelta):
            into.deltas[-1] = TextDelta(last.text + delta.text)
        elif isinstance(delta, ReasoningDelta) and isinstance(last, ReasoningDelta):
            into.deltas[-1] = ReasoningDelta(last.text + delta.text)
        else:
            into.deltas.append(delta)
    into.token_ids.extend(new.token_ids)
    into.logprobs.extend(new.logprobs)
    if new.prompt_logprobs is not None:
        into.prompt_logprobs = new.prompt_logprobs
    into.finish = new.finish or into.finish
