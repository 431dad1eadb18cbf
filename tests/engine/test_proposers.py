"""`NgramProposer.lookup` equals a brute-force prompt lookup (the longest suffix n-gram with an
earlier occurrence, the tokens after its latest one)."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from resin.engine.proposers import NgramProposer


def brute(seq: list[int], k: int, max_n: int, min_n: int) -> list[int]:
    for n in range(min(max_n, len(seq) - 1), min_n - 1, -1):
        suffix = seq[-n:]
        for start in range(len(seq) - 1 - n, -1, -1):  # latest occurrence followed by a token
            if seq[start : start + n] == suffix:
                return seq[start + n : start + n + k]
    return []


@settings(max_examples=500, deadline=None)
@given(
    st.lists(st.integers(0, 4), min_size=1, max_size=40),
    st.integers(1, 6),
    st.integers(1, 5),
    st.integers(1, 5),
)
def test_lookup_equals_brute_force(seq: list[int], k: int, a: int, b: int) -> None:
    max_n, min_n = max(a, b), min(a, b)
    got = NgramProposer(max_n, min_n).lookup(np.asarray(seq, dtype=np.int32), k)
    assert got == brute(seq, k, max_n, min_n)


def test_copying_a_paragraph_proposes_its_continuation() -> None:
    para = [5, 9, 2, 7, 7, 3, 8, 1, 6]
    seq = np.asarray([0, 4, *para, 11, 12, *para[:3]], dtype=np.int32)
    assert NgramProposer().lookup(seq, 4) == para[3:7]
    assert NgramProposer().lookup(np.asarray([1, 2, 3], dtype=np.int32), 4) == []
