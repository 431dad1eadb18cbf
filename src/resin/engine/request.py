"""The request handle `Engine.submit` returns, and the engine's bookkeeping on it."""

from __future__ import annotations

import enum

import numpy as np
import numpy.typing as npt

from resin.engine.grammar import GrammarState
from resin.events import FinishReason, TopLogprob
from resin.params import SamplingParams


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
    `output_token_ids` (generated so far), `finished`, `finish_reason`, `error`,
    `cached_tokens` (prefix-cache hit length of its latest admission).
    `take_result()` returns the generated ids once finished (raises `RuntimeError` before).

    Engine-private state (underscored) invariants: `num_tokens` = prompt + output tokens;
    `num_computed` tokens are in the cache; in DECODE `num_computed == num_tokens - 1`.
    """

    def __init__(self, request_id: int, prompt: tuple[int, ...], params: SamplingParams) -> None:
        self.id = request_id
        self.prompt_token_ids = prompt
        self.sampling_params = params
        self.output_token_ids: list[int] = []
        self.finish_reason: FinishReason | None = None
        self.error: str | None = None
        self.cached_tokens = 0
        # -- engine bookkeeping --
        self._status = Status.WAITING
        self._arrival = 0
        self._slot = -1
        self._prompt = np.asarray(prompt, dtype=np.int32)
        self._full: np.ndarray = self._prompt
        self._num_tokens = len(prompt)
        self._num_computed = 0
        self._retries = 0
        self._stops = frozenset(params.stop_token_ids)
        self._want_prompt_logprobs = params.prompt_logprobs is not None
        self._prompt_logprobs: list[float] = []
        self._prompt_top: list[tuple[TopLogprob, ...]] = []
        self._first_event_sent = False
        self._times = _Times()
        self._grammar: GrammarState | None = None
        self._constrained = False
        """Has a grammar or a logit bias (counted in the engine's `ConstraintSet.active`)."""

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    def _token_array(self, end: int) -> npt.NDArray[np.int32]:
        """Prompt + output as one array, valid at least up to `end` (rebuilt only as needed:
        decode steps never touch it, prefill and prefix caching read slices of it)."""
        if end <= self._full.size:
            return self._full
        out = np.asarray(self.output_token_ids, dtype=np.int32)
        self._full = np.concatenate([self._prompt, out])
        return self._full

    def take_result(self) -> list[int]:
        if self.finish_reason is None:
            raise RuntimeError(f"request {self.id} has not finished")
        return list(self.output_token_ids)

    def __repr__(self) -> str:
        return (
            f"Request(id={self.id}, status={self._status.value}, prompt={self.num_prompt_tokens}, "
            f"output={len(self.output_token_ids)})"
        )


class _Times:
    """Monotonic timestamps for metrics (seconds; 0.0 = not yet)."""

    __slots__ = ("admitted", "arrival", "first_token", "last_token")

    def __init__(self) -> None:
        self.arrival = 0.0
        self.admitted = 0.0
        self.first_token = 0.0
        self.last_token = 0.0
