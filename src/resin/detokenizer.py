"""Incremental detokenization: token ids in, complete UTF-8 text out, piece by piece.

`IncrementalDetokenizer.push(ids)` returns only text that can no longer change: a token that
ends inside a multi-byte character (byte-level BPE) or a byte-fallback piece (`<0xF0>`) decodes
to U+FFFD, so the text is held back until the character completes. Text is always produced by
decoding a short window of ids that starts with the previously emitted piece and subtracting
the window's old text, so tokenizer-specific joining rules (SentencePiece's leading space,
cleanup of spaces around punctuation) are applied exactly as a full decode would apply them.
Invariant: the concatenation of every `push` result and `flush()` equals
`tokenizer.decode(all_ids, skip_special_tokens=...)` for text that decodes cleanly.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

_REPLACEMENT = "\ufffd"
# Held-back ids beyond this many are emitted even when they end in U+FFFD: a valid character
# takes at most 4 byte tokens, so such a run is invalid output, and holding it forever would
# make decoding quadratic.
_MAX_PENDING = 32


class _Decoder(Protocol):
    def decode(self, ids: Sequence[int], skip_special_tokens: bool = False) -> str: ...


class IncrementalDetokenizer:
    """Decode a growing sequence of generated ids into stable text."""

    def __init__(self, tokenizer: _Decoder, *, skip_special_tokens: bool = True) -> None:
        self._tokenizer = tokenizer
        self._skip_special = skip_special_tokens
        self._ids: list[int] = []
        # ids[_prefix:_read] were emitted already and anchor the window; ids[_read:] are pending.
        # Both offsets are always character boundaries (a window that started inside a byte
        # group would turn the whole group into U+FFFD with byte-fallback decoders).
        self._prefix = 0
        self._read = 0

    def _decode(self, ids: Sequence[int]) -> str:
        return self._tokenizer.decode(ids, skip_special_tokens=self._skip_special)

    def push(self, token_ids: Sequence[int]) -> str:
        """Append ids; return the new text that is complete (possibly "")."""
        self._ids.extend(int(t) for t in token_ids)
        if self._read == len(self._ids):
            return ""
        prefix_text = self._decode(self._ids[self._prefix : self._read])
        end = len(self._ids)
        full_text = self._decode(self._ids[self._prefix : end])
        if full_text.endswith(_REPLACEMENT):
            # An incomplete character at the end: emit up to the last complete one (a character
            # spans at most 4 byte tokens) and hold the rest back.
            cut, cut_text = self._last_complete(end)
            if cut > self._read or end - self._read < _MAX_PENDING:
                end, full_text = cut, cut_text
        if len(full_text) <= len(prefix_text):
            return ""  # nothing visible yet: wait for more ids
        common = _common_prefix_len(prefix_text, full_text)
        # `common` < len(prefix_text) only when a later token changed how earlier ones decode
        # (rare cleanup rules); emitting from the common prefix never repeats text.
        self._prefix, self._read = self._read, end
        return full_text[common:]

    def _last_complete(self, end: int) -> tuple[int, str]:
        for cut in range(end - 1, max(self._read, end - 4) - 1, -1):
            text = self._decode(self._ids[self._prefix : cut])
            if not text.endswith(_REPLACEMENT):
                return cut, text
        return self._read, ""

    def flush(self) -> str:
        """Return what is held back (an unfinished character decodes as U+FFFD) and reset."""
        if self._read == len(self._ids):
            return ""
        prefix_text = self._decode(self._ids[self._prefix : self._read])
        full_text = self._decode(self._ids[self._prefix :])
        self._read = len(self._ids)
        self._prefix = self._read
        common = _common_prefix_len(prefix_text, full_text)
        return full_text[common:]


def _common_prefix_len(a: str, b: str) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i
