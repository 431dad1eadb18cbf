"""`HarmonyParser`: gpt-oss output -> deltas, by channel.

The output is a sequence of messages: a header (`<|channel|>analysis`, optionally
` to=functions.NAME` and `<|constrain|>json`) up to `<|message|>`, then a body up to `<|end|>`
(more messages follow, each after `<|start|>assistant`), `<|call|>` or `<|return|>` (stop tokens;
as text they are recognised too). The analysis channel streams as reasoning, final (and
commentary without a recipient, i.e. preambles) as text; a body addressed to `functions.NAME`
is a tool call, buffered and checked as JSON at its end (malformed -> text plus an error).
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from typing import Literal

from resin.recipe.deltas import Delta, ReasoningDelta, TextDelta
from resin.recipe.stream import StreamParser, partial_marker_len
from resin.tokenizer import Tokenizer

_BODY_ENDS = ("<|end|>", "<|call|>", "<|return|>")
_RECIPIENT = re.compile(r"to=([^\s<]+)")
_CHANNEL = re.compile(r"<\|channel\|>\s*([A-Za-z_]+)")


class HarmonyParser(StreamParser):
    def __init__(self, tokenizer: Tokenizer, stop_token_ids: Sequence[int]) -> None:
        super().__init__(tokenizer, stop_token_ids)
        self._buffer = ""
        self._in_body = False
        self._channel = ""
        self._recipient: str | None = None
        self._header = ""

    def _consume(self, text: str) -> list[Delta]:
        self._buffer += text
        out: list[Delta] = []
        while self._step(out):
            pass
        return out

    def _step(self, out: list[Delta]) -> bool:
        if not self._in_body:
            index = self._buffer.find("<|message|>")
            if index < 0:
                return False
            self._header = self._buffer[:index]
            self._buffer = self._buffer[index + len("<|message|>") :]
            channel = _CHANNEL.search(self._header)
            recipient = _RECIPIENT.search(self._header)
            self._channel = channel.group(1) if channel else ""
            self._recipient = recipient.group(1) if recipient else None
            self._in_body = True
            return True
        ends = [(self._buffer.find(m), m) for m in _BODY_ENDS]
        found = min(((i, m) for i, m in ends if i >= 0), default=None)
        if found is None:
            if not self._is_call():
                keep = partial_marker_len(self._buffer, _BODY_ENDS)
                self._emit(self._buffer[: len(self._buffer) - keep], out)
                self._buffer = self._buffer[len(self._buffer) - keep :]
            return False
        index, marker = found
        body, self._buffer = self._buffer[:index], self._buffer[index + len(marker) :]
        self._end_body(body, out)
        return True

    def _is_call(self) -> bool:
        return self._recipient is not None and self._recipient.startswith("functions.")

    def _emit(self, text: str, out: list[Delta]) -> None:
        if text:
            out.append(ReasoningDelta(text) if self._channel == "analysis" else TextDelta(text))

    def _end_body(self, body: str, out: list[Delta]) -> None:
        self._in_body = False
        if not self._is_call():
            self._emit(body, out)
            return
        name = (self._recipient or "").removeprefix("functions.")
        try:
            json.loads(body)
        except ValueError as exc:
            self._error(f"malformed tool call arguments for {name!r} ({exc}); returned as text")
            out.append(TextDelta(body))
            return
        out.extend(self._tool_call(name, body))

    def _flush(self, reason: Literal["stop", "length"]) -> list[Delta]:
        out: list[Delta] = []
        if self._in_body:
            body, self._buffer = self._buffer, ""
            self._end_body(body, out)
        elif self._buffer.strip():
            self._error("response ended inside a harmony header")
            self._buffer = ""
        return out
