"""The byte tokenizer and ChatML recipe of the server tests' doubles (zero-cost stand-ins):
UTF-8 bytes are ids 0..255, the ChatML special tokens follow; answers may hold
`<think>...</think>` reasoning and `<tool_call>{json}` tool calls."""

from __future__ import annotations

import codecs
import json
from collections.abc import Sequence
from typing import Literal

from resin.recipe import (
    Delta,
    Message,
    ParseResult,
    ReasoningDelta,
    RenderedPrompt,
    TextDelta,
    ToolCallArgsDelta,
    ToolCallEnd,
    ToolCallStart,
    ToolDef,
    ToolResult,
)
from resin.recipe.tool_choice import ToolChoice, unsupported

SPECIAL_TOKENS = (
    "<|im_start|>",
    "<|im_end|>",
    "<think>",
    "</think>",
    "<tool_call>",
    "</tool_call>",
    "<|endoftext|>",
)
IM_START, IM_END, THINK, END_THINK, TOOL_CALL, END_TOOL_CALL, EOT = range(256, 263)


class ByteTokenizer:
    """UTF-8 bytes are ids 0..255; the ChatML special tokens follow."""

    vocab_size = 256 + len(SPECIAL_TOKENS)
    special_token_strings = SPECIAL_TOKENS
    eos_token_ids = (IM_END, EOT)

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        ids: list[int] = []
        i = 0
        while i < len(text):
            special = next((s for s in SPECIAL_TOKENS if text.startswith(s, i)), None)
            if special is not None:
                ids.append(256 + SPECIAL_TOKENS.index(special))
                i += len(special)
                continue
            j = text.find("<", i + 1)
            chunk = text[i:] if j < 0 else text[i:j]
            ids.extend(chunk.encode("utf-8"))
            i += len(chunk)
        return ids

    def encode_plain(self, text: str) -> list[int]:
        """`text` as bytes, special-token strings included (they stay text)."""
        return list(text.encode("utf-8"))

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = False) -> str:
        out: list[str] = []
        buf = bytearray()
        for t in ids:
            if t < 256:
                buf.append(t)
                continue
            out.append(buf.decode("utf-8", errors="replace"))
            buf.clear()
            if not skip_special_tokens:
                out.append(SPECIAL_TOKENS[t - 256])
        out.append(buf.decode("utf-8", errors="replace"))
        return "".join(out)


class ChatMLFormat:
    """A `resin.recipe.Recipe`: ChatML rendering; the answer may hold `<think>...</think>`
    and `<tool_call>{json}`."""

    name = "test-chatml"
    supports_tools = True
    supports_reasoning = True
    supports_images = False
    stop_token_ids = (IM_END, EOT)

    def __init__(self, tokenizer: ByteTokenizer | None = None) -> None:
        self.tokenizer = tokenizer or ByteTokenizer()

    def render(
        self,
        messages: Sequence[Message],
        *,
        tools: Sequence[ToolDef] | None = None,
        add_generation_prompt: bool = True,
        enable_thinking: bool | None = None,
        tool_choice: ToolChoice | None = None,
        continue_final_message: bool = False,
    ) -> RenderedPrompt:
        if tool_choice is not None:
            raise unsupported(tool_choice)
        parts: list[str] = []
        if tools:
            specs = [{"name": t.name, "parameters": t.parameters} for t in tools]
            parts.append(f"<|im_start|>system\nTools: {json.dumps(specs)}<|im_end|>\n")
        for turn in messages:
            body = turn.text + "".join(b.content for b in turn.content if isinstance(b, ToolResult))
            for call in turn.tool_calls:
                body += f'<tool_call>{{"name": "{call.name}", "arguments": {call.arguments}}}'
                body += "</tool_call>"
            parts.append(f"<|im_start|>{turn.role}\n{body}<|im_end|>\n")
        if continue_final_message:  # the last turn stays open: the model continues it
            parts[-1] = parts[-1].removesuffix("<|im_end|>\n")
            text = "".join(parts)
            return RenderedPrompt(self.tokenizer.encode(text), text, prefill=messages[-1].text)
        parts.append("<|im_start|>assistant\n")
        if enable_thinking is False:
            parts.append("<think></think>")
        text = "".join(parts)
        return RenderedPrompt(self.tokenizer.encode(text), text)

    def create_parser(
        self, prompt: RenderedPrompt, *, tools: Sequence[ToolDef] | None = None
    ) -> ChatMLParser:
        return ChatMLParser()


class ChatMLParser:
    """Byte-level state machine: text, reasoning (in <think>), tool call (in <tool_call>)."""

    def __init__(self) -> None:
        self._mode = "text"
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._call = bytearray()
        self._calls = 0

    def feed(self, token_ids: Sequence[int]) -> list[Delta]:
        deltas: list[Delta] = []
        for t in token_ids:
            if t < 256 and self._mode == "call":
                self._call.append(t)
            elif t < 256:
                text = self._decoder.decode(bytes([t]))
                if text:
                    deltas.append(
                        ReasoningDelta(text) if self._mode == "think" else TextDelta(text)
                    )
            elif t == THINK:
                self._mode = "think"
            elif t in (END_THINK, TOOL_CALL):
                self._mode = "call" if t == TOOL_CALL else "text"
            elif t == END_TOOL_CALL:
                deltas.extend(self._end_call())
        return deltas

    def _end_call(self) -> list[Delta]:
        self._mode = "text"
        raw = self._call.decode("utf-8", errors="replace")
        self._call.clear()
        try:
            obj = json.loads(raw)
            name, args = str(obj["name"]), json.dumps(obj.get("arguments", {}))
        except (ValueError, KeyError, TypeError):
            return [TextDelta(raw)]  # not a valid call: show it as text, lose nothing
        index = self._calls
        self._calls += 1
        return [
            ToolCallStart(index, f"call_{index}_{abs(hash(raw)) % 10**8}", name),
            ToolCallArgsDelta(index, args),
            ToolCallEnd(index),
        ]

    def finish(self, reason: Literal["stop", "length"] = "stop") -> ParseResult:
        tail = self._decoder.decode(b"", final=True)
        out: list[Delta] = [TextDelta(tail)] if tail else []
        if self._mode == "call" and self._call:
            out.append(TextDelta(self._call.decode("utf-8", errors="replace")))
        return ParseResult(tuple(out), reason, "", "")
