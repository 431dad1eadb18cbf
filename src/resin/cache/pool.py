"""One flat arena of pages with explicit reference counts.

Every cache group (History, Window, State) allocates from the same `PagePool`. A page is either
free (refcount 0, on the free stack) or referenced (refcount >= 1) by sequences and/or the prefix
trie. All operations take numpy arrays so callers never loop per page.

Invariants (`check_invariants`):
- the free stack holds exactly the pages with refcount 0, each once;
- refcounts are never negative.
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
        if pages.size:
            np.add.at(self.refcount, pages, 1)

    def decref(self, pages: I32) -> None:
        """Drop one reference per listed entry; pages reaching 0 go back to the free stack.

        Dropping 0 pages is always safe. Negative refcounts are a bug and raise at once.
        """
        if pages.size == 0:
            return
        if pages.size == 1 or _distinct(pages):
            self.refcount[pages] -= 1
        else:
            np.subtract.at(self.refcount, pages, 1)
        counts = self.refcount[pages]
        if counts.min() < 0:
            raise AssertionError("page refcount went negative")
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


def _distinct(pages: I32) -> bool:
    # Cheap test first: sorted-unique is O(n log n) but only used for multi-page drops.
    return bool(np.unique(pages).size == pages.size)
