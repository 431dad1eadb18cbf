"""The commit's batch-wide fast path builds the same events as the per-row constructor."""

from __future__ import annotations

from resin import TokensEvent
from resin.engine.transaction import token_events


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
