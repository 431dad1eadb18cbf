"""The messages between an engine process and a frontend, and their encoding.

msgspec msgpack, one tagged `Struct` per message. The per-step `Outputs` carries every
request's new tokens as three flat numpy buffers (request ids, token counts, token ids) plus
the finishes and refusals of that step: decoding it costs a few buffer views and one
`TokensEvent` per request, never one Python object per token. Rare, richer parts (logprobs,
sampling parameters, media, a metrics snapshot) travel pickled inside the message: both ends
are processes of one `resin serve`, on one host, started by the same user (the channel
trusts its peer, as `torch.distributed` does).
"""

from __future__ import annotations

import pickle
from collections.abc import Iterable, Sequence
from itertools import chain
from operator import attrgetter
from typing import Any

import msgspec
import numpy as np

from resin.events import Event, FinishedEvent, FinishReason, TokensEvent, plain_tokens_events
from resin.params import SamplingParams
from resin.plan import MediaItem

__all__ = [
    "Abort",
    "Hello",
    "Message",
    "Outputs",
    "Ready",
    "Submit",
    "decode",
    "encode",
    "pack_outputs",
    "unpack_many",
    "unpack_outputs",
]

_ID = np.int64
_TOKEN = np.int32


class Hello(msgspec.Struct, tag=True):
    """Frontend -> engine, once: the engine answers with `Ready`."""

    frontend: int


class Ready(msgspec.Struct, tag=True):
    """Engine -> frontend: the engine loaded, warmed up and serves."""

    pid: int
    context_length: int
    vocab_size: int
    page_size: int
    has_grammar: bool
    compile_timeout_s: float
    metrics: bytes = b""
    """A pickled `MetricsSnapshot` (empty: the engine keeps no metrics)."""


class Submit(msgspec.Struct, tag=True):
    """Frontend -> engine: one request, under the frontend's own id (unique per engine)."""

    rid: int
    prompt: bytes
    """int32 token ids."""
    params: bytes
    """The pickled `SamplingParams` (constraint and logit bias included)."""
    media: bytes = b""
    """The pickled `MediaItem` tuple, empty without media."""


class Abort(msgspec.Struct, tag=True):
    rid: int


class Outputs(msgspec.Struct, tag=True):
    """Engine -> frontend: one step's events for that frontend's requests, in order per
    request: tokens first, then its finish."""

    rids: bytes = b""
    """int64, one per plain `TokensEvent`."""
    counts: bytes = b""
    """int32 tokens per plain event."""
    tokens: bytes = b""
    """int32, the plain events' tokens back to back."""
    cached: bytes = b""
    """int32 prefix-cache hit per plain event (0 after a request's first event)."""
    rich: bytes = b""
    """Pickled `TokensEvent`s with logprobs (requests that asked for them)."""
    finished: list[tuple[int, str, int, int, int, str | None]] = []
    """(rid, reason, prompt tokens, output tokens, cached tokens, error)."""
    refused: list[tuple[int, str, str]] = []
    """(rid, message, kind): requests the engine did not take (`refused` | `busy`)."""
    waiting: int = 0
    running: int = 0
    metrics: bytes = b""
    """A pickled `MetricsSnapshot`, at most every status interval."""


Message = Hello | Ready | Submit | Abort | Outputs

_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder(Message)


def encode(message: Message) -> bytes:
    return _encoder.encode(message)


def decode(data: bytes | memoryview) -> Message:
    return _decoder.decode(data)


def submit_message(
    rid: int,
    prompt: Sequence[int],
    params: SamplingParams,
    media: Sequence[MediaItem] = (),
) -> Submit:
    packed = np.asarray(prompt, dtype=_TOKEN).tobytes()
    items = pickle.dumps(tuple(media)) if media else b""
    return Submit(rid, packed, pickle.dumps(params), items)


def read_submit(msg: Submit) -> tuple[list[int], SamplingParams, tuple[MediaItem, ...]]:
    prompt = np.frombuffer(msg.prompt, dtype=_TOKEN).tolist()
    params = pickle.loads(msg.params)
    if not isinstance(params, SamplingParams):
        raise ValueError("sampling_params must be a SamplingParams")
    media: tuple[MediaItem, ...] = pickle.loads(msg.media) if msg.media else ()
    return prompt, params, media


def _plain(event: TokensEvent) -> bool:
    return event.logprobs is None and event.prompt_logprobs is None


_RID = attrgetter("request_id")
_TOKENS = attrgetter("token_ids")
_CACHED = attrgetter("cached_tokens")


def pack_outputs(events: Sequence[Event]) -> Outputs:
    """One step's `TokensEvent`s and `FinishedEvent`s (of one frontend) as one message."""
    tokens = [e for e in events if type(e) is TokensEvent]
    finished = [e for e in events if type(e) is FinishedEvent]
    # A request with any rich event this step sends all of them rich: its order is kept.
    richer = {e.request_id for e in tokens if not _plain(e)}
    plain = [e for e in tokens if e.request_id not in richer] if richer else tokens
    rich = [e for e in tokens if e.request_id in richer]
    out = Outputs()
    if plain:
        n = len(plain)
        ids = list(map(_TOKENS, plain))
        counts = np.fromiter(map(len, ids), _TOKEN, n)
        out.rids = np.fromiter(map(_RID, plain), _ID, n).tobytes()
        out.counts = counts.tobytes()
        flat = np.fromiter(chain.from_iterable(ids), _TOKEN, int(counts.sum()))
        out.tokens = flat.tobytes()
        out.cached = np.fromiter(map(_CACHED, plain), _TOKEN, n).tobytes()
    if rich:
        out.rich = pickle.dumps(rich)
    out.finished = [
        (e.request_id, e.reason.value, e.num_prompt_tokens, e.num_output_tokens,
         e.cached_tokens, e.error)
        for e in finished
    ]  # fmt: skip
    return out


def unpack_outputs(msg: Outputs) -> list[Event]:
    """The events of `pack_outputs`, in order per request (tokens before the finish)."""
    events: list[Event] = []
    if msg.rids:
        rids = np.frombuffer(msg.rids, dtype=_ID)
        counts = np.frombuffer(msg.counts, dtype=_TOKEN)
        tokens = np.frombuffer(msg.tokens, dtype=_TOKEN).tolist()
        if tokens and counts.min() == counts.max() == 1:  # a decode step: one token each
            ids: Iterable[tuple[int, ...]] = zip(tokens)
        else:
            ends = np.cumsum(counts).tolist()
            ids = map(tuple, map(tokens.__getitem__, map(slice, [0, *ends[:-1]], ends)))
        cached = np.frombuffer(msg.cached, dtype=_TOKEN).tolist()
        events.extend(plain_tokens_events(rids.tolist(), ids, cached, rids.size))
    if msg.rich:
        events.extend(_rich(msg.rich))
    events.extend(_finished(msg))
    return events


def _finished(msg: Outputs) -> list[FinishedEvent]:
    return [
        FinishedEvent(rid, FinishReason(reason), prompt, output, hit, error)
        for rid, reason, prompt, output, hit, error in msg.finished
    ]


def unpack_many(messages: Sequence[Outputs]) -> list[Event]:
    """The events of consecutive messages (a frontend that fell behind reads several steps at
    once), each request's plain tokens of all of them as one `TokensEvent` (in step order,
    `cached_tokens` the largest), then the finishes: fewer events to route and parse for the
    same tokens. Messages with rich events or an empty token event are unpacked one by one."""
    plain = [m for m in messages if m.rids]
    per_message = [np.frombuffer(m.counts, dtype=_TOKEN) for m in plain]
    if len(messages) == 1 or any(m.rich for m in messages) or any(0 in c for c in per_message):
        return [e for m in messages for e in unpack_outputs(m)]
    events: list[Event] = []
    if plain:
        counts = np.concatenate(per_message)
        rids = np.concatenate([np.frombuffer(m.rids, dtype=_ID) for m in plain])
        tokens = np.concatenate([np.frombuffer(m.tokens, dtype=_TOKEN) for m in plain])
        cached = np.concatenate([np.frombuffer(m.cached, dtype=_TOKEN) for m in plain])
        owner = np.repeat(rids, counts)  # each token's request, in step order
        order = np.argsort(owner, kind="stable")
        ids, first, per = np.unique(owner[order], return_index=True, return_counts=True)
        hit = np.zeros(ids.size, dtype=_TOKEN)
        np.maximum.at(hit, np.searchsorted(ids, rids), cached)
        flat = tokens[order].tolist()
        ends = (first + per).tolist()
        runs = map(tuple, map(flat.__getitem__, map(slice, first.tolist(), ends)))
        events.extend(plain_tokens_events(ids.tolist(), runs, hit.tolist(), ids.size))
    for m in messages:
        events.extend(_finished(m))
    return events


def _rich(data: bytes) -> list[Any]:
    events = pickle.loads(data)
    return [e for e in events if isinstance(e, TokensEvent)]
