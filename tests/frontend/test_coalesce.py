"""A batch's runs of plain token events reach the parser as one event each."""

from __future__ import annotations

from resin.events import FinishedEvent, FinishReason, TokensEvent
from resin.frontend.generation import coalesced


def test_plain_runs_merge_and_anything_else_breaks_a_run() -> None:
    rich = TokensEvent(1, (9,), logprobs=(-0.5,))
    end = FinishedEvent(1, FinishReason.LENGTH, 3, 6)
    batch = [
        TokensEvent(1, (1,), cached_tokens=16),
        TokensEvent(1, (2, 3)),
        rich,
        TokensEvent(1, (4,)),
        TokensEvent(1, (5,)),
        end,
    ]
    assert coalesced(batch) == [
        TokensEvent(1, (1, 2, 3), cached_tokens=16),
        rich,
        TokensEvent(1, (4, 5)),
        end,
    ]


def test_a_single_event_and_an_empty_batch_are_left_alone() -> None:
    one = [TokensEvent(1, (1,))]
    assert coalesced(one) is one
    assert coalesced([]) == []
