"""`CacheManager`: one page arena shared by every cache group the runner declared.

It owns the `PagePool`, one table per group and (with prefix caching) the `PrefixTrie`.
The engine talks to it in transactions: `reserve` pages for a step's new tokens (and State
checkpoints), then `commit` (flip State rings, publish full pages to the prefix cache, slide
Windows) or `rollback` (return exactly what `reserve` took).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from resin.cache.groups import PagedGroup, StateGroup, ceil_div
from resin.cache.matching import NO_MATCH, Checkpoints, Match, checkpoint_positions
from resin.cache.pool import OutOfPagesError, PagePool
from resin.cache.prefix_index import PrefixIndex
from resin.plan import CacheGroupPlan
from resin.protocols import CacheLayout, State

I32 = npt.NDArray[np.int32]
_NONE = np.zeros(0, dtype=np.int32)


@dataclass(frozen=True, slots=True)
class PageReservation:
    """What `reserve` changed, so `rollback` can undo it exactly."""

    slots: I32
    old_npages: tuple[I32 | None, ...]
    checkpoints: Checkpoints | None
    prefill: bool

    def rows(self, keep: npt.NDArray[np.bool_]) -> PageReservation:
        """A decode reservation restricted to the kept rows (a pipelined step some of whose
        requests left while it was in flight)."""
        assert not self.prefill and self.checkpoints is None, "only decode steps are pipelined"
        olds = tuple(None if old is None else old[keep] for old in self.old_npages)
        return PageReservation(self.slots[keep], olds, None, False)


class CacheManager:
    """Pages for every slot in every group, from one `PagePool`."""

    def __init__(
        self,
        layout: CacheLayout,
        max_sequences: int,
        table_width: int,
        prefix_cache: bool = False,
    ) -> None:
        self.layout = layout
        self.page_size = layout.page_size
        self.pool = PagePool(layout.num_pages)
        self.groups: list[PagedGroup | StateGroup] = []
        for spec in layout.groups:
            if isinstance(spec, State):
                self.groups.append(StateGroup(spec, self.pool, max_sequences))
            else:
                self.groups.append(
                    PagedGroup(spec, self.pool, max_sequences, table_width, layout.page_size)
                )
        self.paged = [g for g in self.groups if isinstance(g, PagedGroup)]
        self.states = [g for g in self.groups if isinstance(g, StateGroup)]
        self.prefix = (
            PrefixIndex(self.pool, self.groups, layout.page_size) if prefix_cache else None
        )

    # -- capacity -------------------------------------------------------------------------
    def available(self) -> int:
        """Pages a live request can get now: free ones plus evictable prefix-cache ones."""
        evictable = self.prefix.trie.evictable_pages if self.prefix is not None else 0
        return self.pool.num_free + evictable

    def make_free(self, n: int) -> bool:
        """Ensure `n` pages are free, evicting least recently used prefix entries if needed."""
        short = n - self.pool.num_free
        if short > 0 and self.prefix is not None:
            self.prefix.trie.evict(short)
        return self.pool.num_free >= n

    def max_pages_for(self, length: int, chunk: int) -> int:
        """Upper bound on pages a sequence of `length` tokens holds while it is computed."""
        total = 2 * len(self.states)
        if self.prefix is not None:  # transient State checkpoints of one chunk
            total += len(self.states) * (min(chunk, length) // self.page_size + 1)
        for g in self.paged:
            total += g.max_pages_for(length, chunk)
        return total

    def pages_to_allocate(self, slots: I32, cached: I32, totals: I32, prefill: bool) -> int:
        """Pages `reserve` would take for this step (new pages and State checkpoints)."""
        n = sum(int(g.pages_to_allocate(slots, totals).sum()) for g in self.paged)
        if self.prefix is not None and self.states and prefill:
            aligned = totals // self.page_size - cached // self.page_size
            n += len(self.states) * int(aligned.sum())
        return n

    def usage(self) -> float:
        """Pages held by live requests (0-1): evictable prefix-cache pages are not counted,
        so an idle engine reads 0 and a page leak shows."""
        return (self.pool.num_used - self.evictable()) / self.pool.num_pages

    def prefix_usage(self) -> float:
        """Pages held only by the prefix cache (evictable on demand), 0-1."""
        return self.evictable() / self.pool.num_pages

    def evictable(self) -> int:
        return self.prefix.trie.evictable_pages if self.prefix is not None else 0

    # -- prefix matching ------------------------------------------------------------------
    def match(self, tokens: I32) -> Match:
        """The longest prefix hit for the known `tokens` of a sequence, valid for every group
        (none without prefix caching)."""
        return NO_MATCH if self.prefix is None else self.prefix.match(tokens)

    def hit_pages(self, match: Match) -> int:
        """Pages a hit attaches (they count towards `max_pages_for` but are not new)."""
        k, total = len(match.nodes), 0
        for g in self.paged:
            first = 0 if g.window is None else max(0, match.tokens - g.window + 1) // g.page_size
            total += k - first
        return total

    def lock_cost(self, match: Match) -> int:
        """Evictable pages that admitting with `match` takes out of `available()`."""
        return 0 if self.prefix is None else self.prefix.trie.unlocked_pages(list(match.nodes))

    @property
    def prefix_queries(self) -> int:
        return 0 if self.prefix is None else self.prefix.queries

    @property
    def prefix_hits(self) -> int:
        return 0 if self.prefix is None else self.prefix.hits

    # -- lifecycle ------------------------------------------------------------------------
    def admit(self, slot: int, num_tokens: int, match: Match = NO_MATCH) -> int:
        """Give a fresh slot (a sequence of `num_tokens` known tokens) its State rings and the
        pages of its prefix hit; returns the hit length in tokens (already computed)."""
        k = len(match.nodes)
        if self.prefix is not None:
            self.prefix.attach(slot, match, num_tokens)
        for gi, g in enumerate(self.groups):
            if isinstance(g, StateGroup):
                borrowed = match.nodes[-1].pages[gi] if k else -1
                self._incref([borrowed])
                g.attach(slot, self._alloc(2), borrowed)
            elif k:
                first = (
                    0 if g.window is None else max(0, match.tokens - g.window + 1) // g.page_size
                )
                pages = np.asarray([n.pages[gi] for n in match.nodes], dtype=np.int32)
                pages[:first] = -1
                self._incref(pages[first:].tolist())
                g.attach(slot, pages, first)
        return match.tokens

    def reserve(
        self, slots: I32, cached: I32, totals: I32, prefill: bool = False
    ) -> PageReservation:
        """Allocate pages for positions < `totals` (and, with prefix caching in a prefill step,
        State checkpoint pages at page-aligned positions). All or nothing: raises
        `OutOfPagesError` before taking anything when the pages are not there."""
        need = self.pages_to_allocate(slots, cached, totals, prefill)
        if not self.make_free(need):
            raise OutOfPagesError(f"a step needs {need} pages, {self.available()} available")
        olds: list[I32 | None] = []
        for g in self.groups:
            if isinstance(g, PagedGroup):
                pages = self._alloc(int(g.pages_to_allocate(slots, totals).sum()))
                olds.append(g.reserve(slots, totals, pages))
            else:
                olds.append(None)
        checkpoints = None
        if self.prefix is not None and self.states and prefill:
            indptr, token, depth = checkpoint_positions(cached, totals, self.page_size)
            cp_pages = tuple(self._alloc(token.size) for _ in self.states)
            checkpoints = Checkpoints(indptr, token, depth, cp_pages)
        return PageReservation(slots, tuple(olds), checkpoints, prefill)

    def abandon(self, reservation: PageReservation) -> None:
        """A failed step's requests are being quarantined: free what only the step held
        (State checkpoint pages; the rest goes with the requests' slots)."""
        if reservation.checkpoints is not None:
            for pages in reservation.checkpoints.pages:
                self.pool.decref(pages)

    def rollback(self, reservation: PageReservation) -> None:
        for g, old in zip(self.groups, reservation.old_npages, strict=True):
            if isinstance(g, PagedGroup) and old is not None:
                g.rollback(reservation.slots, old)
        if reservation.checkpoints is not None:
            for pages in reservation.checkpoints.pages:
                self.pool.decref(pages)

    def trim(self, reservation: PageReservation, totals: I32) -> None:
        """A speculative step keeps fewer positions than it reserved: return the pages it added
        wholly past `totals` (rejected drafts); a kept page's stale tail is rewritten later."""
        keep = ceil_div(totals, self.page_size)
        for g, old in zip(self.groups, reservation.old_npages, strict=True):
            if isinstance(g, PagedGroup) and old is not None:
                g.rollback(reservation.slots, np.maximum(old, keep).astype(np.int32))

    def commit(self, reservation: PageReservation, totals: I32, tokens: Sequence[I32] = ()) -> None:
        """The step succeeded: State rings flip, new full pages enter the prefix cache (before
        Windows drop what the next query cannot see, so the cache keeps them). In a prefill
        step `tokens[i]` holds at least `totals[i]` tokens of row i's sequence."""
        slots = reservation.slots
        for sg in self.states:
            sg.commit(slots, sg.state_out(slots))
        if self.prefix is not None and reservation.prefill and tokens:
            self.prefix.publish_step(slots, totals, tokens, reservation.checkpoints)
        for g in self.paged:
            g.slide(slots, totals)

    def release(self, slot: int, computed: I32 | None = None) -> None:
        """Free a slot. With prefix caching, the full pages of its `computed` tokens are
        published first (finished or retracted sequences: chat turns and recomputes reuse
        them); None publishes nothing (quarantine)."""
        if self.prefix is not None:
            self.prefix.release(slot, computed)
        for g in self.groups:
            g.release(slot)

    def drop_prefix_cache(self) -> int:
        """Evict every unreferenced prefix-cache entry; returns the pages freed."""
        return 0 if self.prefix is None else self.prefix.trie.clear()

    def _alloc(self, n: int) -> I32:
        if n <= 0:
            return _NONE
        if not self.make_free(n):
            raise OutOfPagesError(f"asked for {n} pages, {self.available()} available")
        return self.pool.alloc(n)

    def _incref(self, pages: list[int]) -> None:
        held = [p for p in pages if p >= 0]
        if held:
            self.pool.incref(np.asarray(held, dtype=np.int32))

    # -- planning -------------------------------------------------------------------------
    def group_plans(
        self, reservation: PageReservation, cached: I32, total: I32, tok_rows: I32, positions: I32
    ) -> tuple[CacheGroupPlan, ...]:
        slots, cps = reservation.slots, reservation.checkpoints
        plans = []
        si = 0
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
                continue
            plans.append(
                CacheGroupPlan(
                    group=i,
                    state_in=g.current[slots],
                    state_out=g.state_out(slots),
                    checkpoint_indptr=(
                        cps.indptr if cps is not None else np.zeros(slots.size + 1, np.int32)
                    ),
                    checkpoint_token=cps.token if cps is not None else _NONE,
                    checkpoint_page=cps.pages[si] if cps is not None else _NONE,
                )
            )
            si += 1
        return tuple(plans)

    # -- checks ---------------------------------------------------------------------------
    def check_invariants(self, live_slots: list[int]) -> None:
        """Every reference in the pool is held by a live slot entry or by the prefix trie."""
        self.pool.check_invariants()
        held = [g.held(s) for s in live_slots for g in self.groups]
        if self.prefix is not None:
            self.prefix.check_invariants(live_slots)
            held.append(self.prefix.trie.held_pages())
        flat = np.concatenate(held) if held else _NONE
        expected = np.bincount(flat, minlength=self.pool.num_pages)
        assert np.array_equal(expected, self.pool.refcount), "refcounts disagree with holders"
