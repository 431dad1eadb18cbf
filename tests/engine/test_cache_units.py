"""Unit tests of the cache parts: the page pool, the prefix trie and its LRU."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from resin.cache import OutOfPagesError, PagePool, PrefixTrie
from resin.cache.groups import checkpoint_positions, deepest_only


def test_pool_alloc_free_refcounts() -> None:
    pool = PagePool(4)
    a = pool.alloc(3)
    assert sorted(a.tolist()) == [0, 1, 2] and pool.num_free == 1
    pool.incref(a[:1])
    pool.decref(a)
    assert pool.num_free == 3 and pool.refcount[a[0]] == 1
    pool.decref(np.zeros(0, dtype=np.int32))  # dropping nothing is safe
    with pytest.raises(OutOfPagesError):
        pool.alloc(4)
    pool.decref(a[:1])
    pool.check_invariants()
    assert pool.num_free == 4
    with pytest.raises(AssertionError):
        pool.decref(a[:1])


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 3), st.integers(1, 4)), max_size=60))
def test_pool_random_operations_keep_invariants(ops: list[tuple[int, int]]) -> None:
    pool = PagePool(16)
    owned: list[int] = []
    for op, n in ops:
        if op == 0 and pool.num_free >= n:
            owned.extend(pool.alloc(n).tolist())
        elif op == 1 and owned:
            pool.incref(np.asarray(owned[:n], dtype=np.int32))
            owned.extend(owned[:n])
        elif owned:
            drop, owned = owned[:n], owned[n:]
            pool.decref(np.asarray(drop, dtype=np.int32))
        pool.check_invariants()
        assert pool.num_used == len(set(owned))


def test_trie_lock_evict_lru_order() -> None:
    pool = PagePool(8)
    trie = PrefixTrie([pool], group_pool=[0])
    pages = pool.alloc(3)
    taken: list[list[int]] = [[]]
    a = trie.insert(trie.root, b"a", [int(pages[0])], taken)
    b = trie.insert(a, b"b", [int(pages[1])], taken)
    c = trie.insert(trie.root, b"c", [int(pages[2])], taken)
    pool.incref(np.asarray(taken[0], dtype=np.int32))
    pool.decref(pages)  # the "request" lets go of its own references
    assert trie.evictable == [0]
    trie.unlock([c])
    trie.unlock([a, b])
    trie.check_invariants()
    assert trie.evictable == [3] and list(trie.lru) == [c, b]
    assert trie.walk(b"ab", 1) == [a, b] and trie.walk(b"ax", 1) == [a]
    # evict(pool, n): until the pool has n free pages (5 are free now)
    assert trie.evict(0, 6) == 1 and trie.walk(b"c", 1) == []  # oldest leaf first
    trie.lock(trie.walk(b"ab", 1))
    assert trie.evict(0, 8) == 0  # locked nodes are never evicted
    trie.unlock([a, b])
    assert trie.evict(0, 8) == 2 and pool.num_free == 8
    trie.check_invariants()


def test_checkpoint_positions_are_page_aligned() -> None:
    cached = np.asarray([0, 3, 8], dtype=np.int32)
    totals = np.asarray([9, 5, 9], dtype=np.int32)
    indptr, index, depth = checkpoint_positions(cached, totals, 4)
    # Row 0 covers positions 0..8: states after 4 and 8 tokens (flat tokens 3 and 7).
    # Row 1 covers 3..4: after 4 tokens (flat 9 + 0). Row 2 covers 8: none.
    assert indptr.tolist() == [0, 2, 3, 3]
    assert index.tolist() == [3, 7, 9] and depth.tolist() == [1, 2, 1]


def test_deepest_only_keeps_each_rows_last_checkpoint() -> None:
    cached = np.asarray([0, 3, 8], dtype=np.int32)
    totals = np.asarray([9, 5, 9], dtype=np.int32)
    indptr, index, depth = deepest_only(*checkpoint_positions(cached, totals, 4))
    assert indptr.tolist() == [0, 1, 2, 2]
    assert index.tolist() == [7, 9] and depth.tolist() == [2, 1]
