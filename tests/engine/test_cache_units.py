"""Unit tests of the cache parts: the page pool, the prefix trie and its LRU."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from resin import CacheGroupPlan, CacheLayout, Compressed, State
from resin.cache import CacheManager, OutOfPagesError, PagePool, PrefixTrie
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
    pool.cache(np.asarray(taken[0], dtype=np.int32))
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
    read = np.asarray([a.pages[0], b.pages[0]], dtype=np.int32)
    pool.incref(read)  # the request locking a-b reads both pages
    assert trie.evict(0, 8) == 0  # pages a request references are never evicted
    pool.decref(read[:1])  # it stops reading a's page (a Window slid past it)
    assert pool.num_cache_only == 1
    # The page goes, the node stays: the request's path is intact, a match stops short of it.
    assert trie.evict(0, 8) == 1 and a.pages == [-1] and trie.walk(b"ab", 1) == [a, b]
    trie.check_invariants()
    pool.check_invariants()
    pool.decref(read[1:])
    trie.unlock([a, b])
    assert trie.evict(0, 8) == 1 and pool.num_free == 8
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


def test_compressed_plan_rows_name_the_entries_each_step_completes() -> None:
    # Compressed(4) with 8-token pages: 2 entries a page; Compressed(16): one entry per page,
    # a page spanning 4 token pages.
    layout = CacheLayout(32, 8, 0, (Compressed(4), Compressed(16), State()), 4, 0)
    cache = CacheManager(layout, max_sequences=2, table_width=8)
    cache.admit(0, 40)
    slots = np.asarray([0], dtype=np.int32)

    def step(cached: int, total: int) -> tuple[CacheGroupPlan, CacheGroupPlan]:
        c, t = np.asarray([cached], np.int32), np.asarray([total], np.int32)
        reservation = cache.reserve(slots, c, t, prefill=True)
        positions = np.arange(cached, total, dtype=np.int32)
        rows = np.zeros(total - cached, dtype=np.int32)
        plans = cache.group_plans(reservation, c, t, rows, positions)
        cache.commit(reservation, t)
        return plans[0], plans[1]

    csa, hca = step(0, 13)  # blocks ending at positions 3, 7, 11 complete; 13 // 16 = 0
    pages = csa.page_ids.tolist()
    assert csa.page_indptr.tolist() == [0, 2] and csa.page_start.tolist() == [0]
    assert csa.entry_indptr.tolist() == [0, 3] and csa.entry_token.tolist() == [3, 7, 11]
    assert csa.entry_slots.tolist() == [pages[0] * 2, pages[0] * 2 + 1, pages[1] * 2]
    assert csa.append_slots.size == 0
    assert hca.page_indptr.tolist() == [0, 0] and hca.entry_indptr.tolist() == [0, 0]
    csa, hca = step(13, 33)  # entries 3..7 of Compressed(4); entries 0, 1 of Compressed(16)
    assert csa.page_ids.tolist()[:2] == pages and csa.page_indptr.tolist() == [0, 4]
    assert csa.entry_token.tolist() == [2, 6, 10, 14, 18]  # positions 15, 19, 23, 27, 31
    assert csa.entry_slots.tolist()[0] == pages[1] * 2 + 1
    assert hca.page_indptr.tolist() == [0, 2] and hca.entry_token.tolist() == [2, 18]
    assert hca.entry_slots.tolist() == hca.page_ids.tolist()  # one entry a page, offset 0
    cache.release(0)
    cache.check_invariants([])
