"""`TaggedParser`: responses whose reasoning and tool calls sit between marker strings.

This covers `<think>...</think>` reasoning and `<tool_call>...</tool_call>`-style tool calls
(Qwen/ChatML, DeepSeek, LFM2, the Jinja recipe's families) and Llama 3's bare-JSON tool call.
The machine has three modes: TEXT, REASONING (inside the reasoning markers) and TOOL (inside
the tool-call markers, buffered until the end marker, then parsed as a whole). Text that might
be the start of a marker is held back, so any split of the output yields the same result.
Reasoning is only recognised before any visible text; newlines right after a marker and before
the reasoning end marker are dropped (templates add them around the blocks).
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum
from typing import Literal

from resin.recipe.deltas import Delta, ReasoningDelta, TextDelta, ToolCallArgsDelta, ToolCallEnd
from resin.recipe.stream import StreamParser, partial_marker_len
from resin.recipe.toolcall_formats import BodyParser, parse_json_calls, parse_llama3_calls
from resin.tokenizer import Tokenizer


@dataclass(frozen=True)
class TagSpec:
    """Markers of one response format. A `None` marker disables that feature.

    `ignored` markers are dropped wherever they appear in TEXT mode (wrappers such as
    DeepSeek's `<｜tool▁calls▁begin｜>`). `bare_json_tools`: a response that starts with `{` or
    `<|python_tag|>` is a Llama-3-style tool call (buffered to the end, text if it fails).
    `strip_leading_newlines`: newlines that open the response are dropped (GLM writes one
    after `<|assistant|>` before its think block or its answer).
    """

    reasoning_start: str | None = "<think>"
    reasoning_end: str | None = "</think>"
    tool_start: str | None = "<tool_call>"
    tool_end: str | None = "</tool_call>"
    tool_body: BodyParser = parse_json_calls
    ignored: tuple[str, ...] = ()
    bare_json_tools: bool = False
    strip_leading_newlines: bool = False


class _Mode(Enum):
    TEXT = 0
    REASONING = 1
    TOOL = 2
    BARE_TOOL = 3


class TaggedParser(StreamParser):
    def __init__(
        self,
        tokenizer: Tokenizer,
        stop_token_ids: Sequence[int],
        spec: TagSpec,
        *,
        in_reasoning: bool = False,
        call_id_prefix: str | None = None,
    ) -> None:
        super().__init__(tokenizer, stop_token_ids, call_id_prefix=call_id_prefix)
        self._spec = spec
        self._mode = _Mode.REASONING if in_reasoning else _Mode.TEXT
        self._buffer = ""
        # drop "\n" at the start of the next section
        self._strip_newlines = in_reasoning or spec.strip_leading_newlines
        self._seen_visible = False  # visible text emitted: reasoning can no longer start
        # The tool call whose arguments are streaming: (index, name, header length, emitted).
        self._streaming: tuple[int, str, int, int] | None = None

    # ---- markers -----------------------------------------------------------------------------
    def _openers(self) -> list[str]:
        spec = self._spec
        markers = list(spec.ignored)
        if spec.tool_start:
            markers.append(spec.tool_start)
        if spec.reasoning_start and spec.reasoning_end and not self._seen_visible:
            markers.append(spec.reasoning_start)
        return markers

    # ---- the machine -------------------------------------------------------------------------
    def _consume(self, text: str) -> list[Delta]:
        self._buffer += text
        out: list[Delta] = []
        while self._step(out):
            pass
        return out

    def _step(self, out: list[Delta]) -> bool:
        """Advance once; False when the buffer needs more text."""
        if self._mode is _Mode.TEXT:
            return self._step_text(out)
        if self._mode is _Mode.REASONING:
            return self._step_reasoning(out)
        if self._mode is _Mode.TOOL:
            return self._step_tool(out)
        return False  # BARE_TOOL buffers everything until finish

    def _step_text(self, out: list[Delta]) -> bool:
        buf = self._buffer
        if self._strip_newlines:
            buf = buf.lstrip("\n")
            self._buffer = buf
            if not buf:
                return False
            self._strip_newlines = False
        if self._spec.bare_json_tools and not self._seen_visible:
            head = buf.lstrip()
            if not head:
                return False
            if head.startswith("{") or head.startswith("<|python_tag|>"):
                self._mode = _Mode.BARE_TOOL
                return False
            if "<|python_tag|>".startswith(head):
                return False  # may still become the tag
        found = _earliest(buf, self._openers())
        if found is None:
            keep = partial_marker_len(buf, self._openers())
            self._emit_text(buf[: len(buf) - keep], out)
            self._buffer = buf[len(buf) - keep :]
            return False
        index, marker = found
        self._emit_text(buf[:index], out)
        if marker == self._spec.reasoning_start and self._seen_visible:
            self._buffer = buf[index:]  # reasoning comes first or not at all: this is text
            return True
        self._buffer = buf[index + len(marker) :]
        if marker == self._spec.reasoning_start:
            self._mode = _Mode.REASONING
            self._strip_newlines = True
        elif marker == self._spec.tool_start:
            self._mode = _Mode.TOOL
        return True

    def _emit_text(self, text: str, out: list[Delta]) -> None:
        if text:
            out.append(TextDelta(text))
            if text.strip():
                self._seen_visible = True

    def _step_reasoning(self, out: list[Delta]) -> bool:
        end = self._spec.reasoning_end or ""
        buf = self._buffer
        if self._strip_newlines:
            buf = buf.lstrip("\n")
            self._buffer = buf
            if not buf:
                return False
            self._strip_newlines = False
        index = buf.find(end)
        if index < 0:
            keep = partial_marker_len(buf, [end])
            body = buf[: len(buf) - keep]
            # Trailing newlines may precede the end marker (and be dropped): hold them back.
            emit = body.rstrip("\n")
            out.append(ReasoningDelta(emit))
            self._buffer = buf[len(emit) :]
            return False
        out.append(ReasoningDelta(buf[:index].rstrip("\n")))
        self._buffer = buf[index + len(end) :]
        self._mode = _Mode.TEXT
        self._strip_newlines = True
        return True

    def _step_tool(self, out: list[Delta]) -> bool:
        end = self._spec.tool_end or ""
        if self._spec.tool_body is parse_json_calls:
            self._stream_arguments(out)
        index = self._buffer.find(end)
        if index < 0:
            return False
        if self._streaming is not None:
            body = self._buffer[:index]
            self._buffer = self._buffer[index + len(end) :]
            self._mode = _Mode.TEXT
            self._strip_newlines = True
            out.extend(self._close_streamed(body))
            return True
        body = self._buffer[:index]
        self._buffer = self._buffer[index + len(end) :]
        self._mode = _Mode.TEXT
        self._strip_newlines = True
        out.extend(self._parse_body(body, f"{self._spec.tool_start}{body}{end}"))
        return True

    def _stream_arguments(self, out: list[Delta]) -> None:
        """Emit the arguments of a JSON tool call as they arrive (see docs/recipes.md).

        The call opens once `{"name": "N", "arguments": ` and the first non-space character
        after it are in the buffer (so the header is the same for every split). What might
        still be the wrapper's closing `}`, trailing spaces or the start of the end marker is
        held back; everything emitted is a prefix of the arguments `_close_streamed` reports."""
        buf = self._buffer
        if self._streaming is None:
            end = self._spec.tool_end or ""
            cut = buf.find(end) if end else -1
            head = _HEADER.match(buf if cut < 0 else buf[:cut])
            # The arguments must start with something other than the end marker's first
            # character, or a split could stream a call that the whole text would not.
            if head is None or (end and buf[head.end()] == end[0]):
                return
            index, start = self._open_call(head.group(1))
            out.append(start)
            self._streaming = (index, head.group(1), head.end(), 0)
        index, name, header, emitted = self._streaming
        end = self._spec.tool_end or ""
        cut = buf.find(end)
        if cut >= 0:
            return  # `_step_tool` closes the call with the rest
        args = buf[header:]
        args = args[: len(args) - partial_marker_len(args, [end])].rstrip()
        if args.endswith("}"):
            args = args[:-1].rstrip()
        if len(args) > emitted:
            out.append(ToolCallArgsDelta(index, args[emitted:]))
            self._streaming = (index, name, header, len(args))

    def _close_streamed(self, body: str) -> list[Delta]:
        """Finish the streaming call: the rest of its arguments, then its end. A body that
        turns out malformed stays a call (its fragments are out) with the raw arguments, and
        the error flag is set."""
        assert self._streaming is not None
        index, name, header, emitted = self._streaming
        self._streaming = None
        whole = body[header:].rstrip()
        args = whole[:-1].rstrip() if whole.endswith("}") else whole
        if not _is_json(args) and _is_json(whole):
            # The model left out the wrapper's closing brace: the last `}` is the arguments'.
            args, body = whole, body.rstrip() + "}"
        out: list[Delta] = []
        if len(args) > emitted:
            out.append(ToolCallArgsDelta(index, args[emitted:]))
        try:
            calls = parse_json_calls(body)
            json.loads(args)
            if len(calls) != 1 or calls[0][0] != name:
                raise ValueError("not a single call")
        except ValueError as exc:
            self._error(f"malformed tool call {name!r} ({exc}); raw arguments kept")
        out.append(ToolCallEnd(index))
        return out

    def _parse_body(self, body: str, raw: str, parser: BodyParser | None = None) -> list[Delta]:
        try:
            calls = (parser or self._spec.tool_body)(body)
        except ValueError as exc:
            self._error(f"malformed tool call ({exc}); returned as text")
            self._seen_visible = True
            return [TextDelta(raw)]
        deltas: list[Delta] = []
        for name, arguments in calls:
            deltas.extend(self._tool_call(name, arguments))
        return deltas

    def _flush(self, reason: Literal["stop", "length"]) -> list[Delta]:
        out: list[Delta] = []
        buf, self._buffer = self._buffer, ""
        if self._mode is _Mode.TEXT:
            if not self._strip_newlines:
                self._emit_text(buf, out)
            else:
                self._emit_text(buf.lstrip("\n"), out)
        elif self._mode is _Mode.REASONING:
            body = buf.lstrip("\n") if self._strip_newlines else buf
            out.append(ReasoningDelta(body.rstrip("\n")))
        elif self._mode is _Mode.TOOL:
            out.extend(self._flush_call(buf, reason))
        else:  # BARE_TOOL: the whole response is one JSON tool call, or plain text after all
            try:
                calls = parse_llama3_calls(buf)
            except ValueError:
                out.append(TextDelta(buf))
            else:
                for name, arguments in calls:
                    out.extend(self._tool_call(name, arguments))
        return out

    def _cut_call(self, body: str) -> list[Delta]:
        """A call cut by the length limit before its arguments streamed (`_flush_call`)."""
        head = _NAME.match(body) if self._spec.tool_body is parse_json_calls else None
        if head is None:
            self._error("tool call cut by the length limit before its name was complete")
            return []
        self._error(f"tool call {head.group(1)!r} cut by the length limit")
        index, start = self._open_call(head.group(1))
        return [start, ToolCallEnd(index)]

    def _flush_call(self, text: str, reason: Literal["stop", "length"]) -> list[Delta]:
        """A call the output ended inside (no end marker). A cut that fell inside the end
        marker (`...}}` then a newline and `</tool`) leaves a whole call: the start of the
        marker after the closing brace is not part of it. A call the length limit cut before
        its arguments stream is never returned as text (the markup is no answer): with its
        name complete it is a call with empty arguments, else it is dropped (an error says
        so); the finish reason stays `length` either way."""
        end = self._spec.tool_end or ""
        head = text[: len(text) - partial_marker_len(text, [end])] if end else text
        buf = head if head.rstrip().endswith("}") else text
        out: list[Delta] = []
        if self._streaming is not None:
            out.extend(self._close_streamed(buf))
        else:
            raw = f"{self._spec.tool_start}{text}"
            try:  # a model may stop right after the JSON without the end marker
                calls = self._spec.tool_body(buf)
            except ValueError as exc:
                if reason == "length":
                    return self._cut_call(buf)
                self._error(f"unterminated tool call ({exc}); returned as text")
                out.append(TextDelta(raw))
            else:
                for name, arguments in calls:
                    out.extend(self._tool_call(name, arguments))
        return out


_NAME = re.compile(r'\s*\{\s*"name"\s*:\s*"([^"\\]+)"\s*[,}]')
"""A JSON tool call's complete name (followed by the next key or the end)."""


# The head of a JSON tool call whose arguments can stream: a plain name (no escapes), then
# "arguments" and the `{` that opens them (kept out of the match). Arguments given as a JSON
# string (or "parameters") are buffered and parsed whole, as before.
_HEADER = re.compile(r'\s*\{\s*"name"\s*:\s*"([^"\\]+)"\s*,\s*"arguments"\s*:\s*(?=\{)')


def _is_json(text: str) -> bool:
    try:
        json.loads(text)
    except ValueError:
        return False
    return True


def _earliest(text: str, markers: list[str]) -> tuple[int, str] | None:
    best: tuple[int, str] | None = None
    for marker in markers:
        index = text.find(marker)
        if index >= 0 and (best is None or index < best[0]):
            best = (index, marker)
    return best
