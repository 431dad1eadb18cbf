"""The request handle `Engine.submit` returns (contract stub; the engine issue fills it in)."""

from __future__ import annotations

from resin.events import FinishReason
from resin.params import SamplingParams


class Request:
    """A submitted request, as its owner sees it.

    Public, read-only for callers: `id`, `prompt_token_ids`, `sampling_params`,
    `output_token_ids` (generated so far), `finished`, `finish_reason`, `error`,
    `cached_tokens` (prefix-cache hit length of its latest admission).
    `take_result()` returns the generated ids once finished (raises `RuntimeError` before).
    """

    def __init__(self, request_id: int, prompt: tuple[int, ...], params: SamplingParams) -> None:
        self.id = request_id
        self.prompt_token_ids = prompt
        self.sampling_params = params
        self.output_token_ids: list[int] = []
        self.finish_reason: FinishReason | None = None
        self.error: str | None = None
        self.cached_tokens = 0

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None

    def take_result(self) -> list[int]:
        if self.finish_reason is None:
            raise RuntimeError(f"request {self.id} has not finished")
        return list(self.output_token_ids)
