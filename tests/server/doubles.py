"""Test doubles of the server tests: a byte tokenizer, a ChatML-style recipe with `<think>`
reasoning and `<tool_call>` JSON tool calls, and a scripted engine.

`FakeEngine` honours the engine contract the server relies on (validation in `submit`, one
`FinishedEvent` per request as its last event, abort, logprobs when asked, a block-aligned
prefix cache so `cached_tokens` is visible) but computes nothing: each step appends the next
token of a script chosen by `responder(prompt_ids)`, cycling when the script runs out.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

from resin.events import Event, FinishedEvent, FinishReason, TokensEvent, TopLogprob
from resin.params import SamplingParams
from tests.server.doubles_chatml import (
    END_THINK,
    END_TOOL_CALL,
    EOT,
    IM_END,
    IM_START,
    SPECIAL_TOKENS,
    THINK,
    TOOL_CALL,
    ByteTokenizer,
    ChatMLFormat,
    ChatMLParser,
)

__all__ = [
    "END_THINK", "END_TOOL_CALL", "EOT", "IM_END", "IM_START", "SPECIAL_TOKENS", "THINK",
    "TOOL_CALL", "ByteTokenizer", "ChatMLFormat", "ChatMLParser", "FakeEngine", "FakeRequest",
    "demo_responder", "echo_responder",
]  # fmt: skip


def echo_responder(tokenizer: ByteTokenizer) -> Callable[[Sequence[int]], list[int]]:
    """Answer "You said: <last user message>" then end the turn."""

    def respond(prompt: Sequence[int]) -> list[int]:
        starts = [i for i, t in enumerate(prompt) if t == IM_START]
        turn = list(prompt[starts[-2] :]) if len(starts) >= 2 else []
        turn = turn[: turn.index(IM_END)] if IM_END in turn else turn
        user = [t for t in turn if t < 256]
        said = bytes(user).decode("utf-8", errors="replace").removeprefix("user\n")
        return [*tokenizer.encode("You said: " + said.strip()), IM_END]

    return respond


def demo_responder(tokenizer: ByteTokenizer) -> Callable[[Sequence[int]], list[int]]:
    """Echo, but show off the parser: a prompt with tools that mentions "weather" gets a tool
    call; one that says "think" gets a reasoning block first; "math" gets Markdown + TeX."""
    echo = echo_responder(tokenizer)

    def respond(prompt: Sequence[int]) -> list[int]:
        text = tokenizer.decode(prompt)
        last = text.rsplit("<|im_start|>user", 1)[-1]
        if "Tools:" in text and "weather" in last and "<|im_start|>tool" not in last:
            call = '{"name": "get_weather", "arguments": {"city": "Paris"}}'
            return tokenizer.encode(f"<tool_call>{call}</tool_call><|im_end|>")
        if "math" in last:
            answer = "**Euler**: $e^{i\\pi} + 1 = 0$ and\n\n$$\\int_0^1 x\\,dx = \\tfrac12$$"
            return tokenizer.encode(answer + "<|im_end|>")
        if "think" in last and "<think></think>" not in text[-40:]:
            return tokenizer.encode("<think>The user wants me to think.</think>") + echo(prompt)
        return echo(prompt)

    return respond


@dataclass
class _Seq:
    id: int
    prompt: tuple[int, ...]
    params: SamplingParams
    script: list[int]
    cached: int
    out: list[int] = field(default_factory=list)
    sent_first: bool = False


@dataclass
class FakeRequest:
    id: int
    cached_tokens: int = 0


class FakeEngine:
    """A scripted engine with the real engine's contract and no compute."""

    def __init__(
        self,
        responder: Callable[[Sequence[int]], list[int]] | None = None,
        *,
        context_length: int = 4096,
        vocab_size: int = ByteTokenizer.vocab_size,
        max_sequences: int = 256,
        step_delay: float = 0.0,
        fail_at_step: int | None = None,
        prefix_block: int = 16,
        tokens_per_step: int = 1,
    ) -> None:
        self.responder = responder or demo_responder(ByteTokenizer())
        self.tokens_per_step = tokens_per_step
        """> 1: each step emits up to this many tokens per request in one event, like a
        speculative engine's verify steps."""
        self.context_length = context_length
        self.vocab_size = vocab_size
        self.max_sequences = max_sequences
        self.step_delay = step_delay
        self.fail_at_step = fail_at_step
        self.prefix_block = prefix_block
        self.steps = 0
        self._next_id = 0
        self._waiting: list[_Seq] = []
        self._running: dict[int, _Seq] = {}
        self._finished: list[Event] = []
        self._prefixes: set[tuple[int, ...]] = set()
        self._owner: threading.Thread | None = None

    @property
    def num_waiting(self) -> int:
        return len(self._waiting)

    @property
    def num_running(self) -> int:
        return len(self._running)

    @property
    def kv_cache_usage(self) -> float:
        held = sum(len(s.prompt) + len(s.out) for s in self._running.values())
        return held / (self.context_length * self.max_sequences)

    def submit(
        self, prompt_token_ids: Sequence[int], sampling_params: SamplingParams | None = None
    ) -> FakeRequest:
        self._check_thread()
        prompt = tuple(int(t) for t in prompt_token_ids)
        if not prompt:
            raise ValueError("prompt is empty")
        if len(prompt) >= self.context_length:
            raise ValueError(f"prompt has {len(prompt)} tokens; context is {self.context_length}")
        if any(t < 0 or t >= self.vocab_size for t in prompt):
            raise ValueError("token id out of the vocabulary")
        params = sampling_params or SamplingParams()
        script = self.responder(prompt) or [0]
        seq = _Seq(self._next_id, prompt, params, script, self._cached_length(prompt))
        self._next_id += 1
        self._waiting.append(seq)
        return FakeRequest(seq.id, seq.cached)

    def _cached_length(self, prompt: tuple[int, ...]) -> int:
        b = self.prefix_block
        hit = 0
        for end in range(b, len(prompt), b):
            if prompt[:end] not in self._prefixes:
                break
            hit = end
        for end in range(b, len(prompt) + 1, b):
            self._prefixes.add(prompt[:end])
        return hit

    def has_work(self) -> bool:
        return bool(self._waiting or self._running or self._finished)

    def abort(self, request: FakeRequest | int) -> None:
        self._check_thread()
        rid = request if isinstance(request, int) else request.id
        seq = self._running.pop(rid, None)
        if seq is None:
            seq = next((s for s in self._waiting if s.id == rid), None)
            if seq is None:
                return
            self._waiting.remove(seq)
        self._finish(seq, FinishReason.ABORT)

    def _finish(self, seq: _Seq, reason: FinishReason) -> None:
        self._finished.append(
            FinishedEvent(seq.id, reason, len(seq.prompt), len(seq.out), seq.cached)
        )

    def step(self) -> list[Event]:
        self._check_thread()
        self.steps += 1
        if self.fail_at_step is not None and self.steps >= self.fail_at_step:
            raise RuntimeError("injected engine failure")
        if self.step_delay:
            time.sleep(self.step_delay)
        events, self._finished = self._finished, []
        while self._waiting and len(self._running) < self.max_sequences:
            seq = self._waiting.pop(0)
            self._running[seq.id] = seq
        for seq in list(self._running.values()):
            events.extend(self._advance_many(seq))
        return events

    def _advance_many(self, seq: _Seq) -> list[Event]:
        events = self._advance(seq)
        while len(events) == 1 and len(events[0].token_ids) < self.tokens_per_step:  # type: ignore[union-attr]
            more = self._advance(seq)
            first, nxt = events[0], more[0]
            assert isinstance(first, TokensEvent) and isinstance(nxt, TokensEvent)
            merged = replace(
                first,
                token_ids=first.token_ids + nxt.token_ids,
                logprobs=None if first.logprobs is None else first.logprobs + (nxt.logprobs or ()),
                top_logprobs=(
                    None if first.top_logprobs is None
                    else first.top_logprobs + (nxt.top_logprobs or ())
                ),
            )  # fmt: skip
            events = [merged, *more[1:]]
        return events

    def _advance(self, seq: _Seq) -> list[Event]:
        p = seq.params
        token = seq.script[len(seq.out) % len(seq.script)]
        seq.out.append(token)
        event = TokensEvent(
            seq.id,
            (token,),
            logprobs=(-0.5,) if p.logprobs is not None else None,
            top_logprobs=(self._tops(token, p.logprobs),) if p.logprobs else None,
            prompt_logprobs=self._prompt_logprobs(seq) if p.prompt_logprobs is not None else None,
            prompt_top_logprobs=self._prompt_tops(seq) if p.prompt_logprobs else None,
            cached_tokens=seq.cached,
        )
        seq.sent_first = True
        stop = token in p.stop_token_ids and not p.ignore_stop_tokens
        if stop and len(seq.out) >= p.min_output_tokens:
            reason: FinishReason | None = FinishReason.STOP
        elif (
            len(seq.out) >= p.max_output_tokens
            or len(seq.prompt) + len(seq.out) >= self.context_length
        ):
            reason = FinishReason.LENGTH
        else:
            reason = None
        if reason is None:
            return [event]
        del self._running[seq.id]
        done = FinishedEvent(seq.id, reason, len(seq.prompt), len(seq.out), seq.cached)
        return [event, done]

    def _tops(self, token: int, k: int | None) -> tuple[TopLogprob, ...]:
        alts = [TopLogprob(token, -0.5)]
        alts += [TopLogprob((token + i) % self.vocab_size, -1.0 - i) for i in range(1, k or 0)]
        return tuple(alts)

    def _prompt_logprobs(self, seq: _Seq) -> tuple[float, ...] | None:
        return None if seq.sent_first else tuple(-1.0 for _ in seq.prompt[1:])

    def _prompt_tops(self, seq: _Seq) -> tuple[tuple[TopLogprob, ...], ...] | None:
        if seq.sent_first:
            return None
        return tuple(self._tops(t, seq.params.prompt_logprobs) for t in seq.prompt[1:])

    def _check_thread(self) -> None:
        # The real engine is not thread-safe; the fake enforces single-thread use so the
        # server's tests catch a handler that touches the engine directly.
        current = threading.current_thread()
        if self._owner is None:
            self._owner = current
        elif self._owner is not current:
            raise RuntimeError("FakeEngine used from two threads")

    def close(self) -> None:
        self._waiting.clear()
        self._running.clear()
