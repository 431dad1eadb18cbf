"""Engine knobs, the arena size decision, and prompt validation at `submit`."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from resin.params import SamplingParams
from resin.protocols import CacheLayout, RunnerConfig, State

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


def resolve_layout(rc: RunnerConfig, config: EngineConfig) -> CacheLayout:
    """`num_pages` exact, else `cache_bytes // page_bytes`, else room for `max_sequences`
    full contexts (capped at `MAX_DEFAULT_PAGES`)."""
    page_bytes = rc.page_bytes
    if rc.num_pages is not None:
        num_pages = rc.num_pages
    elif rc.cache_bytes is not None and page_bytes > 0:
        num_pages = rc.cache_bytes // page_bytes
    else:
        per_seq = config.page_table_width(rc.page_size)
        per_seq = per_seq * sum(not isinstance(g, State) for g in rc.cache_groups)
        per_seq += 2 * sum(isinstance(g, State) for g in rc.cache_groups)
        num_pages = min(MAX_DEFAULT_PAGES, per_seq * config.max_sequences)
    if num_pages < 1:
        raise ValueError(f"the cache must have at least one page, got {num_pages}")
    return CacheLayout(
        num_pages=num_pages,
        page_size=rc.page_size,
        page_bytes=page_bytes,
        groups=rc.cache_groups,
    )


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
    return tuple(int(t) for t in arr.tolist())


def check_params(params: SamplingParams, rc: RunnerConfig) -> None:
    """A `ValueError` for more logprobs than the runner returns (the features it lacks:
    `RunnerConfig.check_request`)."""
    if params.logprobs is not None and params.logprobs > rc.max_logprobs:
        raise ValueError(f"logprobs must be <= {rc.max_logprobs}")
