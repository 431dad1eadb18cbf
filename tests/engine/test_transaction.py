"""The commit's batch-wide fast path builds the same events as the per-row constructor."""

from __future__ import annotations

from resin import TokensEvent
from resin.engine.transaction import token_events
from resin.events import plain_tokens_events


def test_token_events_equal_the_dataclass_constructor() -> None:
    ids, tokens, cached = [3, 1, 7], [10, 20, 30], [0, 16, 5]
    got = token_events(iter(ids), tokens, iter(cached), 3)
    want = [
        TokensEvent(i, (t,), cached_tokens=c) for i, t, c in zip(ids, tokens, cached, strict=True)
    ]
    assert got == want
    assert all(type(e) is TokensEvent for e in got)
    assert [hash(e) for e in got] == [hash(e) for e in want]
    assert token_events(iter([]), [], iter([]), 0) == []


def test_plain_tokens_events_take_any_token_runs() -> None:
    runs = [(1, 2, 3), (), (4,)]
    got = plain_tokens_events([5, 6, 7], iter(runs), [0, 0, 9], 3)
    assert got == [
        TokensEvent(5, (1, 2, 3)),
        TokensEvent(6, ()),
        TokensEvent(7, (4,), cached_tokens=9),
    ]
