"""Per-group page bookkeeping over the shared `PagePool`, indexed by sequence slot.

`PagedGroup` serves History and Window groups: a slot's pages live in `table[slot, k]` for
logical page k (tokens `k*page_size .. (k+1)*page_size - 1`). A Window group releases pages
that fall wholly out of the window at once (`slide`), marking them -1, so a slot holds at most
`ceil(size / page_size) + 1` pages between steps however long it runs. `StateGroup` gives each
slot a two-page checkpoint ring plus the page holding its current checkpoint.

Everything is vectorized over slots: no Python loop per page or token.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from resin.cache.pool import PagePool
from resin.protocols import History, State, Window

I32 = npt.NDArray[np.int32]
I64 = npt.NDArray[np.int64]


def ceil_div(a: npt.NDArray[np.int32] | int, b: int) -> npt.NDArray[np.int32]:
    return np.asarray((np.asarray(a) + (b - 1)) // b, dtype=np.int32)


@dataclass(frozen=True, slots=True)
class PagedRows:
    """One group's CSR rows and append slots for a step (see `CacheGroupPlan`)."""

    page_indptr: I32
    page_ids: I32
    page_start: I32
    append_slots: I64


class PagedGroup:
    """History (window None) or Window(size) pages of every slot.

    Invariants: `table[s, :live_from[s]]` are -1 (released), `table[s, live_from[s]:npages[s]]`
    are pages the slot holds one reference to, the rest are -1.
    """

    def __init__(
        self,
        spec: History | Window,
        pool: PagePool,
        max_sequences: int,
        table_width: int,
        page_size: int,
    ) -> None:
        self.spec = spec
        self.window = spec.size if isinstance(spec, Window) else None
        self.pool = pool
        self.page_size = page_size
        self.table = np.full((max_sequences, table_width), -1, dtype=np.int32)
        self.npages = np.zeros(max_sequences, dtype=np.int32)
        self.live_from = np.zeros(max_sequences, dtype=np.int32)

    # -- sizing ---------------------------------------------------------------------------
    def first_visible_page(self, positions: I32) -> I32:
        """Logical index of the oldest page a query at `positions` reads (Window) or 0."""
        if self.window is None:
            return np.zeros_like(positions)
        first = np.maximum(positions - self.window + 1, 0) // self.page_size
        return np.asarray(first, dtype=np.int32)

    def pages_to_allocate(self, slots: I32, total_lens: I32) -> I32:
        """Pages each slot must gain so that positions < total_lens are addressable."""
        need = ceil_div(total_lens, self.page_size) - self.npages[slots]
        return np.asarray(np.maximum(need, 0), dtype=np.int32)

    def max_pages_for(self, length: int, chunk: int) -> int:
        """Upper bound on pages one sequence of `length` tokens holds while computing it."""
        full = -(-length // self.page_size)
        if self.window is None:
            return full
        return min(full, -(-(self.window + chunk) // self.page_size) + 1)

    # -- transactions ---------------------------------------------------------------------
    def reserve(self, slots: I32, total_lens: I32, pages: I32) -> I32:
        """Give the slots the `pages` (already allocated) they need; returns the old npages."""
        old = self.npages[slots].copy()
        need = np.maximum(ceil_div(total_lens, self.page_size) - old, 0)
        if pages.size:
            rows = np.repeat(slots, need)
            starts = np.cumsum(need) - need
            cols = np.repeat(old, need) + (np.arange(pages.size) - np.repeat(starts, need))
            self.table[rows, cols] = pages
            self.npages[slots] = old + need
        return old

    def rollback(self, slots: I32, old_npages: I32) -> None:
        """Undo `reserve`: drop the pages added since `old_npages`."""
        cur = self.npages[slots]
        extra = cur - old_npages
        if extra.any():
            rows = np.repeat(slots, extra)
            starts = np.cumsum(extra) - extra
            cols = np.repeat(old_npages, extra) + (
                np.arange(int(extra.sum())) - np.repeat(starts, extra)
            )
            self.pool.decref(self.table[rows, cols])
            self.table[rows, cols] = -1
            self.npages[slots] = old_npages

    def slide(self, slots: I32, next_positions: I32) -> None:
        """Window only: release pages no query at `next_positions` or later can see."""
        if self.window is None:
            return
        keep_from = self.first_visible_page(next_positions)
        old = self.live_from[slots]
        drop = np.maximum(keep_from - old, 0)
        if drop.any():
            rows = np.repeat(slots, drop)
            starts = np.cumsum(drop) - drop
            cols = np.repeat(old, drop) + (np.arange(int(drop.sum())) - np.repeat(starts, drop))
            self.pool.decref(self.table[rows, cols])
            self.table[rows, cols] = -1
            self.live_from[slots] = old + drop

    def attach(self, slot: int, pages: I32, live_from: int) -> None:
        """Start a slot with prefix-cache pages (the caller already holds their references).

        `pages[k]` is logical page k; entries below `live_from` must be -1.
        """
        self.table[slot, : pages.size] = pages
        self.npages[slot] = pages.size
        self.live_from[slot] = live_from

    def release(self, slot: int) -> None:
        held = self.table[slot, self.live_from[slot] : self.npages[slot]]
        self.pool.decref(held[held >= 0])
        self.table[slot, : self.npages[slot]] = -1
        self.npages[slot] = 0
        self.live_from[slot] = 0

    def held(self, slot: int) -> I32:
        row = self.table[slot, self.live_from[slot] : self.npages[slot]]
        return row[row >= 0]

    # -- planning -------------------------------------------------------------------------
    def rows(self, slots: I32, cached: I32, total: I32, tok_rows: I32, positions: I32) -> PagedRows:
        """CSR rows (chronological, from the first page the row's first query sees) + slots.

        `tok_rows[t]` is the slot of flat query token t, `positions[t]` its position.
        """
        ps = self.page_size
        start = self.first_visible_page(cached).astype(np.int32)
        end = ceil_div(total, ps)
        counts = end - start
        indptr = np.zeros(slots.size + 1, dtype=np.int32)
        np.cumsum(counts, out=indptr[1:])
        lo, hi = int(start.min()), int(end.max())
        sub = self.table[slots, lo:hi]
        if (start == lo).all() and (end == hi).all():
            page_ids = sub.reshape(-1)  # every row spans the same pages (common in decode)
        else:
            cols = np.arange(lo, hi, dtype=np.int32)
            page_ids = sub[(cols >= start[:, None]) & (cols < end[:, None])]
        append = self.table[tok_rows, positions // ps].astype(np.int64) * ps + positions % ps
        return PagedRows(indptr, page_ids, start, append)


class StateGroup:
    """A two-checkpoint ring per slot.

    `ring[s]` holds the slot's two pages; `current[s]` is the page with its latest committed
    state (-1 = zero state, or a borrowed prefix-cache page listed in `borrowed[s]`).
    The plan reads `current` (`state_in`, immutable this step) and writes the ring page that
    is not `current` (`state_out`), so a rollback simply keeps `current`.
    """

    def __init__(self, spec: State, pool: PagePool, max_sequences: int) -> None:
        self.spec = spec
        self.pool = pool
        self.ring = np.full((max_sequences, 2), -1, dtype=np.int32)
        self.current = np.full(max_sequences, -1, dtype=np.int32)
        self.borrowed = np.full(max_sequences, -1, dtype=np.int32)

    def attach(self, slot: int, ring: I32, borrowed: int) -> None:
        """Start a slot with its own two pages and an optional borrowed starting checkpoint."""
        self.ring[slot] = ring
        self.current[slot] = borrowed
        self.borrowed[slot] = borrowed

    def state_out(self, slots: I32) -> I32:
        ring = self.ring[slots]
        return np.where(self.current[slots] == ring[:, 0], ring[:, 1], ring[:, 0]).astype(np.int32)

    def commit(self, slots: I32, outs: I32) -> None:
        self.current[slots] = outs
        borrowed = self.borrowed[slots]
        held = borrowed[borrowed >= 0]
        if held.size:
            self.pool.decref(held)
            self.borrowed[slots] = -1

    def release(self, slot: int) -> None:
        pages = np.concatenate([self.ring[slot], self.borrowed[slot : slot + 1]])
        self.pool.decref(pages[pages >= 0])
        self.ring[slot] = -1
        self.current[slot] = -1
        self.borrowed[slot] = -1

    def held(self, slot: int) -> I32:
        pages = np.concatenate([self.ring[slot], self.borrowed[slot : slot + 1]])
        return pages[pages >= 0]
