"""One flat arena of pages with explicit reference counts.

Every cache group of a region allocates from the same `PagePool`. A page is either free
(refcount 0, on the free stack) or referenced (refcount >= 1) by sequences and/or the prefix
trie. All operations take numpy arrays so callers never loop per page.

The pool also knows which pages the prefix trie references (`cache` / `uncache`) and counts
those that *only* the trie references (`num_cache_only`): what evicting from the prefix cache
can free. A page becomes cache-only whenever its last sequence lets go of it, whether its trie
node is still on a live sequence's path or not (a Window page that slid out of the window, a
State checkpoint the sequence moved past), so that count is the one exact measure of what a
live request can still get.

Invariants (`check_invariants`):
- the free stack holds exactly the pages with refcount 0, each once;
- refcounts are never negative; a page the trie references has refcount >= 1;
- `num_cache_only` = pages the trie references with refcount exactly 1.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

I32 = npt.NDArray[np.int32]


class OutOfPagesError(RuntimeError):
    """An allocation asked for more pages than are free (a scheduler bug, never user-facing)."""


class PagePool:
    """Free stack + refcounts for `num_pages` pages. Allocation order is LIFO (cache-warm)."""

    def __init__(self, num_pages: int) -> None:
        if num_pages < 1:
            raise ValueError("the page pool needs at least one page")
        self.num_pages = num_pages
        self.refcount = np.zeros(num_pages, dtype=np.int32)
        # Reversed so the first allocations hand out pages 0, 1, 2 ... (readable tests).
        self._free = np.arange(num_pages - 1, -1, -1, dtype=np.int32)
        self._top = num_pages
        self.cached = np.zeros(num_pages, dtype=np.bool_)
        """Pages the prefix trie holds a reference on."""
        self._num_cached = 0
        self._cache_only = 0

    @property
    def num_cache_only(self) -> int:
        """Pages referenced by the prefix trie alone: evicting them frees them."""
        return self._cache_only

    @property
    def num_free(self) -> int:
        return self._top

    @property
    def num_used(self) -> int:
        return self.num_pages - self._top

    def alloc(self, n: int) -> I32:
        """Take `n` free pages (refcount becomes 1). Raises `OutOfPagesError` when short."""
        if n > self._top:
            raise OutOfPagesError(f"asked for {n} pages, {self._top} free")
        if n <= 0:
            return np.zeros(0, dtype=np.int32)
        pages = self._free[self._top - n : self._top][::-1].copy()
        self._top -= n
        self.refcount[pages] = 1
        return pages

    def incref(self, pages: I32) -> None:
        """Add one reference to each listed page (duplicates count twice)."""
        if pages.size == 0:
            return
        watched = self._watched(pages)
        if watched is not None:  # a cache-only page gains a holder: it is no longer evictable
            self._cache_only -= int(np.count_nonzero(self.refcount[watched] == 1))
        np.add.at(self.refcount, pages, 1)

    def cache(self, pages: I32) -> None:
        """The prefix trie takes a reference on each of `pages` (distinct, not cached yet)."""
        if pages.size == 0:
            return
        assert not self.cached[pages].any(), "a page entered the prefix cache twice"
        self.incref(pages)
        self.cached[pages] = True
        self._num_cached += int(pages.size)
        self._cache_only += int(np.count_nonzero(self.refcount[pages] == 1))

    def uncache(self, pages: I32) -> None:
        """The prefix trie drops its reference on each of `pages` (distinct, cached)."""
        if pages.size == 0:
            return
        assert self.cached[pages].all(), "a page left the prefix cache it was not in"
        self._cache_only -= int(np.count_nonzero(self.refcount[pages] == 1))
        self.cached[pages] = False
        self._num_cached -= int(pages.size)
        self.decref(pages)

    def cache_only_pages(self) -> I32:
        """The pages only the prefix trie references (what `num_cache_only` counts)."""
        return np.flatnonzero(self.cached & (self.refcount == 1)).astype(np.int32)

    def _watched(self, pages: I32) -> I32 | None:
        """The distinct cached pages among `pages` (None: none, the common case)."""
        if self._num_cached == 0:
            return None
        hit = self.cached[pages]
        if not hit.any():
            return None
        return np.unique(pages[hit])

    def decref(self, pages: I32) -> None:
        """Drop one reference per listed entry; pages reaching 0 go back to the free stack.

        Dropping 0 pages is always safe. Negative refcounts are a bug and raise at once.
        """
        if pages.size == 0:
            return
        watched = self._watched(pages)
        if watched is not None:
            self._cache_only -= int(np.count_nonzero(self.refcount[watched] == 1))
        if pages.size == 1 or _distinct(pages):
            self.refcount[pages] -= 1
        else:
            np.subtract.at(self.refcount, pages, 1)
        counts = self.refcount[pages]
        if counts.min() < 0:
            raise AssertionError("page refcount went negative")
        if watched is not None:  # its last sequence let go: only the trie holds it now
            left = self.refcount[watched]
            if not left.all():
                raise AssertionError("a page the prefix cache holds was freed")
            self._cache_only += int(np.count_nonzero(left == 1))
        freed = pages[counts == 0]
        if freed.size:
            freed = np.unique(freed)
            self._free[self._top : self._top + freed.size] = freed
            self._top += freed.size

    def check_invariants(self) -> None:
        free = self._free[: self._top]
        assert np.all(self.refcount >= 0), "negative refcount"
        assert np.unique(free).size == free.size, "a page is on the free stack twice"
        assert np.all(self.refcount[free] == 0), "a free page has references"
        assert int(np.count_nonzero(self.refcount == 0)) == self._top, "a page leaked"
        assert np.all(self.refcount[self.cached] >= 1), "a cached page is free"
        assert int(self.cached.sum()) == self._num_cached, "cached page count drifted"
        assert self.cache_only_pages().size == self._cache_only, "cache-only count drifted"


def _distinct(pages: I32) -> bool:
    # Cheap test first: sorted-unique is O(n log n) but only used for multi-page drops.
    return bool(np.unique(pages).size == pages.size)
