"""Engine knobs, the arena size decision, and prompt validation at `submit`."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from resin.cache.groups import sequence_pages
from resin.params import SamplingParams
from resin.protocols import CacheLayout, RunnerConfig

MAX_DEFAULT_PAGES = 1 << 18
"""Cap on the page count the engine picks when the runner declares no size (fake runners)."""


@dataclass(frozen=True, slots=True)
class EngineConfig:
    """Every engine knob, once: the `Engine`'s keywords land here and each part (scheduler,
    cache, slot store, transaction, speculation) reads its knobs from this object."""

    context_length: int
    """The longest sequence, prompt + output, in tokens."""
    prefix_cache: bool
    max_batch_tokens: int
    """Query tokens per step (a decode step: its row cap too)."""
    max_sequences: int
    """Sequences admitted at once (the slot count)."""
    prefill_chunk_tokens: int
    enable_metrics: bool
    max_retries: int
    max_prefill_streak: int = 4
    """Consecutive prefill steps allowed while decodes wait (the queue-age rule)."""
    max_decode_wait_s: float = 0.5
    """...or seconds since the last decode step, whichever comes first."""

    def __post_init__(self) -> None:
        for name in ("context_length", "max_batch_tokens", "max_sequences", "prefill_chunk_tokens"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an int >= 1")
        if self.max_retries < 0:
            raise ValueError("max_retries must be >= 0")

    def page_table_width(self, page_size: int) -> int:
        """Page-table width: a sequence holds at most `context_length` tokens (prompt +
        output; `submit` refuses longer prompts and `SlotStore` ends a request there), plus
        one position of slack for the token sampled last."""
        return -(-(self.context_length + 1) // page_size)


@dataclass(frozen=True, slots=True)
class ArenaReport:
    """How the arena was split and how many full-context sequences each region holds."""

    token_pages: int
    state_pages: int
    token_bytes: int
    state_bytes: int
    token_pages_per_sequence: int
    """Token pages one sequence of `context_length` tokens holds (every non-State group)."""
    state_pages_per_sequence: int
    """State pages one admitted sequence holds (each State group's ring)."""
    token_sequences: int
    """Full-context sequences the token region holds."""
    state_sequences: int | None
    """Sequences the state region holds (None: no State group)."""
    longest_sequence: int
    """The longest sequence (at most `context_length` tokens) the token region holds alone:
    the context a server can promise."""

    @property
    def sequences(self) -> int:
        """Full-context sequences the arena holds at once."""
        if self.state_sequences is None:
            return self.token_sequences
        return min(self.token_sequences, self.state_sequences)

    def __str__(self) -> str:
        text = (
            f"{self.token_pages} token pages ({self.token_bytes} B) hold "
            f"{self.token_sequences} full-context sequences "
            f"({self.token_pages_per_sequence} pages each)"
        )
        if self.state_sequences is not None:
            text += (
                f"; {self.state_pages} state pages ({self.state_bytes} B) hold "
                f"{self.state_sequences} sequences' states "
                f"({self.state_pages_per_sequence} pages each)"
            )
        return text


def resolve_layout(rc: RunnerConfig, config: EngineConfig) -> CacheLayout:
    """Size the arena's two regions (`resin.protocols`).

    Token region: `num_pages` exact, else the bytes `cache_bytes` leaves after the state
    region, else room for `max_sequences` full contexts (capped at `MAX_DEFAULT_PAGES`).
    State region (only with State groups): `num_state_pages` exact; else, from `cache_bytes`,
    the rings of as many full-context sequences as the bytes hold (at most `max_sequences`),
    so that neither region strands the other's sequences (prefix checkpoints take what the
    rings leave free); else every admitted sequence's ring plus a chunk of checkpoints.
    """
    page_bytes, state_bytes = rc.page_bytes, rc.state_page_bytes
    chunk = min(config.prefill_chunk_tokens, config.context_length)
    tokens_per_seq, states_per_seq = sequence_pages(
        rc.cache_groups, config.context_length + 1, chunk, rc.page_size
    )
    default_states = states_per_seq // 2 * config.max_sequences * (chunk // rc.page_size + 3)
    num_states = rc.num_state_pages if rc.num_state_pages is not None else default_states
    if rc.num_pages is not None:
        num_pages = rc.num_pages
    elif rc.cache_bytes is not None and page_bytes + state_bytes > 0:
        per_seq = tokens_per_seq * page_bytes + states_per_seq * state_bytes
        fit = min(config.max_sequences, rc.cache_bytes // per_seq)
        if rc.num_state_pages is None and states_per_seq:
            num_states = max(1, fit) * states_per_seq
        left = rc.cache_bytes - num_states * state_bytes
        num_pages = left // page_bytes if page_bytes else max(1, tokens_per_seq)
    else:
        num_pages = min(MAX_DEFAULT_PAGES, max(1, tokens_per_seq) * config.max_sequences)
    if num_pages < 1:
        raise ValueError(f"the cache must have at least one page, got {num_pages}")
    if states_per_seq and num_states < states_per_seq:
        raise ValueError(
            f"the state region must hold one sequence's {states_per_seq} State pages, "
            f"got {num_states}"
        )
    return CacheLayout(
        num_pages=num_pages,
        page_size=rc.page_size,
        page_bytes=page_bytes,
        groups=rc.cache_groups,
        state_pages=num_states if states_per_seq else 0,
        state_page_bytes=state_bytes,
    )


def arena_report(layout: CacheLayout, config: EngineConfig) -> ArenaReport:
    """What `layout` holds at `config.context_length` per sequence (`ArenaReport`)."""
    chunk = min(config.prefill_chunk_tokens, config.context_length)
    tokens, states = sequence_pages(
        layout.groups, config.context_length + 1, chunk, layout.page_size
    )
    return ArenaReport(
        token_pages=layout.num_pages,
        state_pages=layout.state_pages,
        token_bytes=layout.num_pages * layout.page_bytes,
        state_bytes=layout.state_pages * layout.state_page_bytes,
        token_pages_per_sequence=tokens,
        state_pages_per_sequence=states,
        token_sequences=layout.num_pages // tokens if tokens else config.max_sequences,
        state_sequences=layout.state_pages // states if states else None,
        longest_sequence=_longest_sequence(layout, config.context_length, chunk),
    )


def _longest_sequence(layout: CacheLayout, context: int, chunk: int) -> int:
    """The largest length <= `context` whose token pages fit the token region (at least 1)."""

    def fits(tokens: int) -> bool:
        pages, _ = sequence_pages(layout.groups, tokens + 1, chunk, layout.page_size)
        return pages <= layout.num_pages

    low, high = 1, context
    while low < high:
        mid = (low + high + 1) // 2
        low, high = (mid, high) if fits(mid) else (low, mid - 1)
    return low


def validate_prompt(
    prompt: Sequence[int], rc: RunnerConfig, config: EngineConfig
) -> tuple[int, ...]:
    """The prompt as a tuple of ints, or a `ValueError` that says what is wrong."""
    if isinstance(prompt, str | bytes):
        raise ValueError("the prompt must be a sequence of token ids, not text")
    try:
        arr = np.asarray(prompt)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"the prompt must be a flat sequence of token ids: {exc}") from None
    if arr.ndim != 1:
        raise ValueError("the prompt must be a flat sequence of token ids")
    if arr.size == 0:
        raise ValueError("the prompt is empty")
    if arr.dtype == np.bool_ or not np.issubdtype(arr.dtype, np.integer):
        raise ValueError("prompt token ids must be ints")
    if int(arr.min()) < 0:
        raise ValueError("prompt token ids must be >= 0")
    if rc.vocab_size is not None and int(arr.max()) >= rc.vocab_size:
        raise ValueError(
            f"prompt token id {int(arr.max())} is outside the vocabulary [0, {rc.vocab_size})"
        )
    if arr.size >= config.context_length:
        raise ValueError(
            f"the prompt has {arr.size} tokens; the context length is {config.context_length} "
            "(the prompt must be shorter, to leave room for output)"
        )
    if int(arr.max()) >= 2**31:
        raise ValueError("prompt token ids must be < 2**31")
    return tuple(arr.tolist())  # Python ints already (an integer array's tolist)


def check_params(params: SamplingParams, rc: RunnerConfig) -> None:
    """A `ValueError` for more logprobs than the runner returns (the features it lacks:
    `RunnerConfig.check_request`)."""
    if params.logprobs is not None and params.logprobs > rc.max_logprobs:
        raise ValueError(f"logprobs must be <= {rc.max_logprobs}")
