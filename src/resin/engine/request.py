"""The request handle `Engine.submit` returns, and the small API the engine keeps it through."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from resin.engine.grammar import GrammarState
from resin.engine.media import cache_keys
from resin.events import FinishReason, TopLogprob
from resin.params import SamplingParams
from resin.plan import MediaItem


class Status(enum.Enum):
    WAITING = "waiting"
    """Queued (new, or retracted and waiting to recompute)."""
    PREFILL = "prefill"
    """Admitted; its known tokens are being computed chunk by chunk."""
    DECODE = "decode"
    """Every known token but the last is in the cache; one token per step."""
    FINISHED = "finished"


class Request:
    """A submitted request, as its owner sees it.

    Public, read-only for callers: `id`, `prompt_token_ids`, `sampling_params`,
    `output_token_ids` (generated so far), `media` (its images, `MediaItem`s by position),
    `finished`, `finish_reason`, `error`, `cached_tokens` (prefix-cache hit length of its
    latest admission).
    `take_result()` returns the generated ids once finished (raises `RuntimeError` before).

    Engine side (written only inside `resin.engine`, each by one owner;
    `tests/test_ownership.py` holds the scheduler to it):
    - its progress, the `Scheduler`'s alone: `output_token_ids`, `status`, `slot` (-1 unless
      admitted), `arrival` (submit order), `cached_tokens`, `retries` (consecutive failed
      attempts), `drafts` (what the runner proposed to follow it, `ForwardOutput.draft_ids`),
      `finish_reason` / `error`; its committed / in-flight counts are the `SlotStore`'s row
      `slot`, which the scheduler alone writes too. Other modules hand the scheduler results
      (`Scheduler.commit`, `retried`, `drop`, ...);
    - `num_tokens` (prompt + output), `token_array(end)`: the sequence, read-only;
    - `started` (its first `TokensEvent` was sent) and `prompt_lp` (prompt logprobs collected
      so far; None unless asked for): the events' bookkeeping, the `Transaction`'s (cleared by
      the scheduler on admission until `started`);
    - `times`: monotonic timestamps for metrics (the transaction's and the scheduler's);
    - `grammar` (its constraint's state, None without one) and `constrained` (has a grammar or
      a logit bias): the `ConstraintSet`'s.
    """

    def __init__(
        self,
        request_id: int,
        prompt: tuple[int, ...],
        params: SamplingParams,
        media: tuple[MediaItem, ...] = (),
    ) -> None:
        self.id = request_id
        self.media = media
        self.prompt_token_ids = prompt
        self.sampling_params = params
        self.output_token_ids: list[int] = []
        self.finish_reason: FinishReason | None = None
        self.error: str | None = None
        self.cached_tokens = 0
        # -- engine side (see the class docstring) --
        self.status = Status.WAITING
        self.arrival = 0
        self.slot = -1
        self.retries = 0
        self.drafts: tuple[int, tuple[int, ...]] = (0, ())
        """(num_tokens, ids): drafts the runner proposed to follow the sequence once it had
        `num_tokens` tokens (stale once it moved on; `MtpProposer`)."""
        self.started = False
        self.prompt_lp = PromptLogprobs() if params.prompt_logprobs is not None else None
        self.times = Times()
        self._prompt = np.asarray(prompt, dtype=np.int32)
        self._full: npt.NDArray[np.int32] = self._prompt
        self._prompt_keys = cache_keys(self._prompt, media) if media else self._prompt
        self.grammar: GrammarState | None = None
        self.constrained = False
        """Has a grammar or a logit bias (counted in the engine's `ConstraintSet.active`)."""

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def num_tokens(self) -> int:
        """Known tokens: prompt + output."""
        return self._prompt.size + len(self.output_token_ids)

    def token_array(self, end: int) -> npt.NDArray[np.int32]:
        """Prompt + output as one array, valid at least up to `end` (rebuilt only as needed:
        decode steps never touch it, prefill and prefix caching read slices of it)."""
        if end <= self._full.size:
            return self._full
        out = np.asarray(self.output_token_ids, dtype=np.int32)
        self._full = np.concatenate([self._prompt, out])
        return self._full

    def cache_keys(self, end: int) -> npt.NDArray[np.int32]:
        """`token_array(end)[:end]` as the prefix cache keys it: image placeholders carry their
        image's content hash (`resin.engine.media.cache_keys`)."""
        tokens = self.token_array(end)[:end]
        if not self.media:
            return tokens
        head = self._prompt_keys[: min(end, self._prompt_keys.size)]
        return np.concatenate([head, tokens[head.size :]])

    def take_result(self) -> list[int]:
        if self.finish_reason is None:
            raise RuntimeError(f"request {self.id} has not finished")
        return list(self.output_token_ids)

    def __repr__(self) -> str:
        return (
            f"Request(id={self.id}, status={self.status.value}, prompt={self.num_prompt_tokens}, "
            f"output={len(self.output_token_ids)})"
        )


@dataclass(slots=True)
class PromptLogprobs:
    """Prompt-token logprobs collected chunk by chunk until the first event carries them."""

    values: list[float] = field(default_factory=list)
    top: list[tuple[TopLogprob, ...]] = field(default_factory=list)

    def clear(self) -> None:
        self.values.clear()
        self.top.clear()


class Times:
    """Monotonic timestamps for metrics (seconds; 0.0 = not yet)."""

    __slots__ = ("admitted", "arrival", "first_token", "last_token")

    def __init__(self) -> None:
        self.arrival = 0.0
        self.admitted = 0.0
        self.first_token = 0.0
        self.last_token = 0.0
