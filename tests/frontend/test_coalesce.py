"""`RequestStream` is the one place streamed events coalesce: the plain token events of the
deliveries a reader has not taken yet come out as one event of their tokens, while an event
with logprobs, a finish or an error event keeps its place and breaks a run."""

from __future__ import annotations

import asyncio

from resin.events import ErrorEvent, Event, FinishedEvent, FinishReason, TokensEvent
from resin.frontend.stream import RequestStream


def _read(deliveries: list[list[Event]], min_tokens: int = 0) -> list[Event] | object:
    async def run() -> list[Event] | object:
        stream = RequestStream()
        for number, item in enumerate(deliveries):
            assert stream.push(item, number)
        return await stream.get(min_tokens)

    return asyncio.run(run())


def test_plain_runs_merge_across_deliveries_and_anything_else_breaks_a_run() -> None:
    rich = TokensEvent(1, (9,), logprobs=(-0.5,))
    end = FinishedEvent(1, FinishReason.LENGTH, 3, 6)
    deliveries: list[list[Event]] = [
        [TokensEvent(1, (1,), cached_tokens=16)],
        [TokensEvent(1, (2, 3))],
        [rich, TokensEvent(1, (4,))],
        [TokensEvent(1, (5,)), end],
    ]
    assert _read(deliveries) == [
        TokensEvent(1, (1, 2, 3), cached_tokens=16),
        rich,
        TokensEvent(1, (4, 5)),
        end,
    ]


def test_a_single_event_is_passed_on_as_is_and_errors_keep_their_place() -> None:
    one = TokensEvent(1, (1,), cached_tokens=4)
    taken = _read([[one]])
    assert isinstance(taken, list) and taken[0] is one
    error = ErrorEvent("step failed", (1,), retryable=True)
    assert _read([[TokensEvent(1, (1,))], [error], [TokensEvent(1, (2,))]]) == [
        TokensEvent(1, (1,)),
        error,
        TokensEvent(1, (2,)),
    ]


def test_the_reader_takes_a_merged_batch_once_it_holds_its_interval() -> None:
    async def run() -> None:
        stream = RequestStream()
        waiting = asyncio.ensure_future(stream.get(3))
        stream.push([TokensEvent(7, (1,))], 0)
        stream.push([TokensEvent(7, (2,))], 1)
        await asyncio.sleep(0)
        assert not waiting.done()  # two tokens: the reader waits for its third
        stream.push([TokensEvent(7, (3,))], 2)
        assert await waiting == [TokensEvent(7, (1, 2, 3))]
        stream.push([TokensEvent(7, (4,))], 3)
        assert await stream.get(1) == [TokensEvent(7, (4,))]  # the buffer restarted empty

    asyncio.run(run())
