"""Images of a request on the engine side: validation at submit, prefix-cache keys that carry
each image's content hash, chunk ends that respect bidirectional spans, and the plan's items.

Prefix-cache keys: the trie compares pages by their exact token ids. Placeholder tokens are
the same for every image, so the cache sees a copy of the sequence in which every placeholder
is replaced by a negative key derived from the image's content hash and its index in the span
(real token ids are >= 0, so a key never equals text). Two requests with the same image bytes
and text share pages; another image with the same placeholders diverges at the page holding
its first placeholder. The cache itself knows nothing of images.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

import numpy as np
import numpy.typing as npt

from resin.plan import MediaItem

I32 = npt.NDArray[np.int32]


def validate_media(
    items: Sequence[MediaItem], prompt_len: int, chunk: int
) -> tuple[MediaItem, ...]:
    """Items sorted by position; raises `ValueError` on spans outside the prompt, overlapping
    spans, or a bidirectional span longer than one prefill chunk (it could never be computed
    in one step)."""
    ordered = tuple(sorted(items, key=lambda item: item.position))
    end = 0
    for item in ordered:
        if not isinstance(item, MediaItem):
            raise ValueError("media items must be resin.plan.MediaItem")
        if item.length < 1 or item.position < end or item.end > prompt_len:
            raise ValueError(
                f"media span {item.position}..{item.end} is empty, overlaps another or leaves "
                f"the {prompt_len}-token prompt"
            )
        if item.bidirectional and item.length > chunk:
            raise ValueError(
                f"a {item.length}-token image needs prefill_chunk_tokens >= {item.length}"
            )
        end = item.end
    return ordered


def cache_keys(tokens: I32, items: Sequence[MediaItem]) -> I32:
    """`tokens` with each span's placeholders replaced by content-derived negative keys."""
    keys = tokens.copy()
    for item in items:
        seed = (
            int(item.content_hash[:15], 16)
            if _is_hex(item.content_hash)
            else hash(item.content_hash)
        )
        offsets = np.arange(item.length, dtype=np.int64)
        keys[item.position : item.end] = -1 - ((seed + offsets * 0x9E3779B1) % (2**31 - 1))
    return keys


def prompt_keys(prompt: Sequence[int], items: Sequence[MediaItem] = ()) -> I32:
    """A prompt as the prefix cache keys it (`cache_keys` over its int32 tokens)."""
    tokens = np.asarray(prompt, dtype=np.int32)
    return cache_keys(tokens, items) if items else tokens


def _is_hex(text: str) -> bool:
    return len(text) >= 15 and all(c in "0123456789abcdefABCDEF" for c in text[:15])


def chunk_end(items: Sequence[MediaItem], computed: int, n: int) -> int:
    """Shorten a chunk `computed .. computed + n` so it does not end inside a bidirectional
    span (it then stops before the span), unless it starts inside or at the span's start (it
    then runs to the span's end; `validate_media` keeps spans within one chunk)."""
    end = computed + n
    for item in items:
        if item.bidirectional and item.position < end < item.end:
            end = item.end if item.position <= computed else item.position
    return end - computed


def plan_media(
    media: Sequence[Sequence[MediaItem]], totals: npt.NDArray[np.int32]
) -> tuple[MediaItem, ...]:
    """The plan's items: per row, every item whose span starts before the row's total
    (`totals` int array [B]); nothing to do, and no per-row work, for text-only steps."""
    if not any(media):
        return ()
    return tuple(
        replace(item, row=row)
        for row, (items, total) in enumerate(zip(media, totals.tolist(), strict=True))
        for item in items
        if item.position < total
    )
