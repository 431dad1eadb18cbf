"""Per-request generation policy: limits, stop tokens, sampling and logprob options.

`SamplingParams` is frozen and validated on construction, so a bad value fails at
`Engine.submit` (or earlier) with a clear `ValueError` and nothing is queued.
Stop *strings* are a serving-layer concern (the server sees text); the engine
only knows stop token ids. The engine has no default EOS token: pass the model's
stop tokens explicitly (a recipe's `stop_token_ids` does this for chat).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

MAX_LOGPROBS = 20
"""Upper bound on `logprobs` / `prompt_logprobs` alternatives (OpenAI's own cap)."""

INT32_MAX = 2**31 - 1
"""Counts and token ids travel to runners in int32 plan arrays; larger values are refused."""


@dataclass(frozen=True, slots=True)
class SamplingParams:
    """How one request generates.

    Invariants (checked in `__post_init__`):
    - `max_output_tokens >= 1`, `0 <= min_output_tokens <= max_output_tokens`;
    - `temperature >= 0` (0 means greedy), `0 < top_p <= 1`, `top_k >= 0` (0 = off),
      `0 <= min_p <= 1`;
    - `seed` is None or a non-negative int below 2**63;
    - `logprobs` / `prompt_logprobs` are None or in [0, MAX_LOGPROBS]; 0 asks for the
      chosen token's logprob only, k > 0 adds the top-k alternatives.
    """

    max_output_tokens: int = 16
    stop_token_ids: tuple[int, ...] = ()
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    seed: int | None = None
    logprobs: int | None = None
    prompt_logprobs: int | None = None
    min_output_tokens: int = 0
    """Stop tokens are ignored until this many tokens were generated."""
    ignore_stop_tokens: bool = False
    """Generate exactly `max_output_tokens` (benchmarks; `ignore_eos` in vLLM)."""

    def __post_init__(self) -> None:
        # Accept any iterable of ints for convenience, store a tuple (hashable, frozen).
        stops = tuple(int(t) for t in self.stop_token_ids)
        object.__setattr__(self, "stop_token_ids", stops)
        _check(_is_int(self.max_output_tokens), "max_output_tokens must be an int")
        _check(
            1 <= self.max_output_tokens <= INT32_MAX,
            f"max_output_tokens must be in [1, {INT32_MAX}]",
        )
        _check(_is_int(self.min_output_tokens), "min_output_tokens must be an int")
        _check(
            0 <= self.min_output_tokens <= self.max_output_tokens,
            "min_output_tokens must be in [0, max_output_tokens]",
        )
        _check(all(0 <= t <= INT32_MAX for t in stops), "stop_token_ids must be in [0, 2**31)")
        _check(_finite(self.temperature) and self.temperature >= 0, "temperature must be >= 0")
        _check(_finite(self.top_p) and 0 < self.top_p <= 1, "top_p must be in (0, 1]")
        _check(
            _is_int(self.top_k) and 0 <= self.top_k <= INT32_MAX,
            f"top_k must be an int in [0, {INT32_MAX}] (0 = off)",
        )
        _check(_finite(self.min_p) and 0 <= self.min_p <= 1, "min_p must be in [0, 1]")
        if self.seed is not None:
            _check(_is_int(self.seed) and 0 <= self.seed < 2**63, "seed must be in [0, 2**63)")
        for name in ("logprobs", "prompt_logprobs"):
            value = getattr(self, name)
            if value is not None:
                _check(
                    _is_int(value) and 0 <= value <= MAX_LOGPROBS,
                    f"{name} must be None or an int in [0, {MAX_LOGPROBS}]",
                )

    @property
    def greedy(self) -> bool:
        return self.temperature == 0 or self.top_k == 1


def _check(ok: bool, message: str) -> None:
    if not ok:
        raise ValueError(message)


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _finite(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
