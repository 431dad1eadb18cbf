"""`resin serve --fake-runner`'s runner answers as the real runners do: logprobs only when a
request asked for them, so its decode steps take the engine's batch-wide commit path."""

from __future__ import annotations

from resin import Engine, SamplingParams, TokensEvent
from resin_app.loading import ZeroCostRunner


class Recording(ZeroCostRunner):
    def __init__(self) -> None:
        super().__init__(vocab_size=64, token_id=7)
        self.logprobs: list[bool] = []

    def forward(self, plan: object) -> object:
        out = super().forward(plan)
        self.logprobs.append(out.logprobs is not None)  # type: ignore[attr-defined]
        return out


def _tokens(engine: Engine) -> dict[int, list[int]]:
    got: dict[int, list[int]] = {}
    while engine.has_work():
        for event in engine.step():
            if isinstance(event, TokensEvent):
                got.setdefault(event.request_id, []).extend(event.token_ids)
    return got


def test_logprobs_only_when_asked() -> None:
    runner = Recording()
    engine = Engine(runner, context_length=256)
    engine.submit([1, 2, 3], SamplingParams(max_output_tokens=4, ignore_stop_tokens=True))
    assert _tokens(engine) == {0: [7, 7, 7, 7]}
    assert runner.logprobs and not any(runner.logprobs)
    runner.logprobs.clear()
    asked = engine.submit([1, 2], SamplingParams(max_output_tokens=3, logprobs=2))
    events = []
    while engine.has_work():
        events.extend(e for e in engine.step() if isinstance(e, TokensEvent))
    assert all(runner.logprobs)
    assert [t for e in events for t in e.token_ids] == [7, 7, 7]
    assert all(e.logprobs == (0.0,) and e.request_id == asked.id for e in events)
