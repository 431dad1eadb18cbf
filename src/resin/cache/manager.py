"""`CacheManager`: one page arena shared by every cache group the runner declared.

It sizes nothing itself (the engine passes the `CacheLayout`), owns the `PagePool`, one table
per group and (with prefix caching) the `PrefixCache`. The engine talks to it in transactions:
`reserve` pages for a step's new tokens, then `commit` (flip State rings, slide Windows) or
`rollback` (return exactly the pages `reserve` took).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import numpy.typing as npt

from resin.cache.groups import PagedGroup, StateGroup, ceil_div
from resin.cache.pool import OutOfPagesError, PagePool
from resin.plan import CacheGroupPlan
from resin.protocols import CacheLayout, State

if TYPE_CHECKING:
    from resin.engine.request import Request

I32 = npt.NDArray[np.int32]


@dataclass(frozen=True, slots=True)
class Reservation:
    """What `reserve` changed, so `rollback` can undo it exactly."""

    slots: I32
    old_npages: tuple[I32 | None, ...]


class CacheManager:
    """Pages for every slot in every group, from one `PagePool`."""

    def __init__(
        self,
        layout: CacheLayout,
        max_slots: int,
        max_pages_per_seq: int,
        prefix_cache: bool = False,
    ) -> None:
        self.layout = layout
        self.page_size = layout.page_size
        self.pool = PagePool(layout.num_pages)
        self.groups: list[PagedGroup | StateGroup] = []
        for spec in layout.groups:
            if isinstance(spec, State):
                self.groups.append(StateGroup(spec, self.pool, max_slots))
            else:
                self.groups.append(
                    PagedGroup(spec, self.pool, max_slots, max_pages_per_seq, layout.page_size)
                )
        self.paged = [g for g in self.groups if isinstance(g, PagedGroup)]
        self.states = [g for g in self.groups if isinstance(g, StateGroup)]

    # -- capacity -------------------------------------------------------------------------
    def available(self) -> int:
        """Pages a live request can get now (free pages; the prefix cache adds evictable)."""
        return self.pool.num_free

    def make_free(self, n: int) -> bool:
        """Ensure `n` pages are free (evicting prefix-cache entries if needed)."""
        return self.pool.num_free >= n

    def pages_per_sequence(self, length: int, chunk: int) -> int:
        """Upper bound on pages a sequence of `length` tokens holds while it is computed."""
        total = 2 * len(self.states)
        for g in self.paged:
            total += g.max_pages_for(length, chunk)
        return total

    def pages_to_allocate(self, slots: I32, total_lens: I32) -> int:
        return sum(int(g.pages_to_allocate(slots, total_lens).sum()) for g in self.paged)

    def usage(self) -> float:
        return self.pool.num_used / self.pool.num_pages

    # -- lifecycle ------------------------------------------------------------------------
    def admit(self, slot: int) -> None:
        """Give a fresh slot its fixed pages (State rings). Caller checked `available`."""
        for g in self.states:
            g.attach(slot, self._alloc(2), -1)

    def reserve(self, slots: I32, total_lens: I32) -> Reservation:
        """Allocate the pages that positions < `total_lens` need. Caller checked capacity."""
        olds: list[I32 | None] = []
        for g in self.groups:
            if isinstance(g, PagedGroup):
                pages = self._alloc(int(g.pages_to_allocate(slots, total_lens).sum()))
                olds.append(g.reserve(slots, total_lens, pages))
            else:
                olds.append(None)
        return Reservation(slots, tuple(olds))

    def rollback(self, reservation: Reservation) -> None:
        for g, old in zip(self.groups, reservation.old_npages, strict=True):
            if isinstance(g, PagedGroup) and old is not None:
                g.rollback(reservation.slots, old)

    def commit(self, slots: I32, total_lens: I32, requests: Sequence[Request] = ()) -> None:
        """The step succeeded: State rings flip, Windows drop what the next query cannot see."""
        for g in self.groups:
            if isinstance(g, StateGroup):
                g.commit(slots, g.state_out(slots))
            else:
                g.slide(slots, total_lens)

    def release(self, slot: int, request: Request | None = None, cacheable: bool = True) -> None:
        for g in self.groups:
            g.release(slot)

    def _alloc(self, n: int) -> I32:
        if not self.make_free(n):
            raise OutOfPagesError(f"asked for {n} pages, {self.available()} available")
        return self.pool.alloc(n)

    # -- planning -------------------------------------------------------------------------
    def group_plans(
        self, slots: I32, cached: I32, total: I32, tok_rows: I32, positions: I32
    ) -> tuple[CacheGroupPlan, ...]:
        plans = []
        for i, g in enumerate(self.groups):
            if isinstance(g, PagedGroup):
                r = g.rows(slots, cached, total, tok_rows, positions)
                plans.append(
                    CacheGroupPlan(
                        group=i,
                        page_indptr=r.page_indptr,
                        page_ids=r.page_ids,
                        page_start=r.page_start,
                        append_slots=r.append_slots,
                    )
                )
            else:
                plans.append(
                    CacheGroupPlan(
                        group=i,
                        state_in=g.current[slots].copy(),
                        state_out=g.state_out(slots),
                        checkpoint_indptr=np.zeros(slots.size + 1, dtype=np.int32),
                    )
                )
        return tuple(plans)

    # -- checks ---------------------------------------------------------------------------
    def check_invariants(self, live_slots: list[int]) -> None:
        """Every reference in the pool is held by exactly one live slot entry (or the trie)."""
        self.pool.check_invariants()
        held = [g.held(s) for s in live_slots for g in self.groups]
        flat = np.concatenate(held) if held else np.zeros(0, dtype=np.int32)
        expected = np.bincount(flat, minlength=self.pool.num_pages)
        assert np.array_equal(expected, self.pool.refcount), "refcounts disagree with holders"
        for g in self.paged:
            for s in live_slots:
                assert g.npages[s] <= ceil_div(g.table.shape[1] * g.page_size, g.page_size)
