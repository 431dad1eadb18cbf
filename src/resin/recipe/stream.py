"""`StreamParser`: the shared half of every response parser.

It turns token ids into text (stop tokens consumed, incomplete characters held back by the
`IncrementalDetokenizer`), hands the text to the format-specific `_consume`, and keeps the totals
(`text`, `reasoning`, `tool_calls`, `error`) from the deltas it returns, so a subclass only
writes its state machine. A subclass must be split-invariant: the deltas it yields for a text
may be grouped differently for different splits, but their concatenation must not change.
"""

from __future__ import annotations

import secrets
from collections.abc import Sequence
from typing import Literal

from resin.detokenizer import IncrementalDetokenizer
from resin.recipe.deltas import (
    Delta,
    ParseResult,
    ReasoningDelta,
    TextDelta,
    ToolCallArgsDelta,
    ToolCallEnd,
    ToolCallStart,
    merge_deltas,
)
from resin.recipe.types import ToolCall
from resin.tokenizer import Tokenizer


class StreamParser:
    """Base of the response parsers; subclasses implement `_consume` and `_flush`."""

    def __init__(
        self,
        tokenizer: Tokenizer,
        stop_token_ids: Sequence[int],
        *,
        call_id_prefix: str | None = None,
    ) -> None:
        self._stop_ids = frozenset(int(t) for t in stop_token_ids)
        # Special tokens stay visible: several formats use them as markers (<|channel|>, ...).
        self._detok = IncrementalDetokenizer(tokenizer, skip_special_tokens=False)
        self._stopped = False
        self._finished = False
        self._call_prefix = call_id_prefix or f"call_{secrets.token_hex(6)}"
        self._text: list[str] = []
        self._reasoning: list[str] = []
        self._calls: list[tuple[str, str, list[str]]] = []  # (id, name, argument fragments)
        self._errors: list[str] = []
        self._pending_calls = 0
        self._primed: list[Delta] = []  # tool-call deltas of `prime`, sent with the first output

    # ---- public protocol -------------------------------------------------------------------
    def feed(self, token_ids: Sequence[int]) -> list[Delta]:
        if self._stopped or self._finished:
            return []
        ids: list[int] = []
        for token in token_ids:
            if int(token) in self._stop_ids:
                self._stopped = True
                break
            ids.append(int(token))
        text = self._detok.push(ids)
        if self._stopped:
            text += self._detok.flush()
        return self._record(self._unprimed(self._consume(text))) if text else []

    def feed_text(self, text: str) -> list[Delta]:
        if self._finished or not text:
            return []
        return self._record(self._unprimed(self._consume(text)))

    def finish(self, reason: Literal["stop", "length"] = "stop") -> ParseResult:
        deltas: list[Delta] = []
        if not self._finished:
            tail = self._detok.flush()
            if tail:
                deltas.extend(self._consume(tail))
            deltas.extend(self._flush(reason))
            self._finished = True
        recorded = self._record(self._unprimed(deltas))
        calls = tuple(ToolCall(i, n, "".join(f)) for i, n, f in self._calls)
        finish_reason: Literal["stop", "length", "tool_calls"] = reason
        if reason == "stop" and calls:
            finish_reason = "tool_calls"
        return ParseResult(
            deltas=tuple(recorded),
            finish_reason=finish_reason,
            text="".join(self._text),
            reasoning="".join(self._reasoning),
            tool_calls=calls,
            error="; ".join(self._errors) if self._errors else None,
        )

    def prime(self, text: str) -> None:
        """Consume `text` the prompt already holds (a forced prefix, an assistant prefill): it
        moves the state machine, and its text and reasoning are dropped (the client wrote them
        or never sees them). A tool call it opened goes out with the first deltas of the model's
        output: the call is whole only with them."""
        if text:
            keep = (d for d in self._consume(text) if not isinstance(d, TextDelta | ReasoningDelta))
            self._primed.extend(keep)

    def _unprimed(self, deltas: list[Delta]) -> list[Delta]:
        held, self._primed = self._primed, []
        return held + deltas if held else deltas

    # ---- for subclasses --------------------------------------------------------------------
    def _consume(self, text: str) -> list[Delta]:
        raise NotImplementedError

    def _flush(self, reason: Literal["stop", "length"]) -> list[Delta]:
        raise NotImplementedError

    def _error(self, message: str) -> None:
        self._errors.append(message)

    def _open_call(self, name: str) -> tuple[int, ToolCallStart]:
        """Start a tool call whose arguments will stream as `ToolCallArgsDelta` fragments."""
        index = self._pending_calls
        self._pending_calls += 1
        return index, ToolCallStart(index, f"{self._call_prefix}_{index}", name)

    def _tool_call(self, name: str, arguments: str) -> list[Delta]:
        """Deltas for one complete tool call (index and id assigned here)."""
        index = self._pending_calls
        self._pending_calls += 1
        call_id = f"{self._call_prefix}_{index}"
        return [
            ToolCallStart(index, call_id, name),
            ToolCallArgsDelta(index, arguments),
            ToolCallEnd(index),
        ]

    def _record(self, deltas: list[Delta]) -> list[Delta]:
        merged = merge_deltas(deltas)
        for delta in merged:
            if isinstance(delta, TextDelta):
                self._text.append(delta.text)
            elif isinstance(delta, ReasoningDelta):
                self._reasoning.append(delta.text)
            elif isinstance(delta, ToolCallStart):
                self._calls.append((delta.id, delta.name, []))
            elif isinstance(delta, ToolCallArgsDelta):
                self._calls[delta.index][2].append(delta.fragment)
        return merged


def partial_marker_len(text: str, markers: Sequence[str]) -> int:
    """Length of the longest suffix of `text` that is a proper prefix of one of `markers`
    (that many characters must be held back: they may start a marker)."""
    best = 0
    for marker in markers:
        for size in range(min(len(marker) - 1, len(text)), best, -1):
            if text.endswith(marker[:size]):
                best = size
                break
    return best
