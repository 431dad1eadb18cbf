"""`CacheManager`: one arena shared by every cache group the runner declared.

It owns the pools (the token region's `PagePool`, and the state region's when a State group
exists), one `Kind` per group (`groups.py`) and, with prefix caching, the `PrefixIndex`. It
loops over the kinds and never tells them apart. The engine talks to it in transactions:
`reserve` pages for a step's new tokens (and State checkpoints), then `commit` (State rings
flip, full pages enter the prefix cache, Windows slide) or `rollback` (return exactly what
`reserve` took).

Page counts it reports (`available`, `max_pages_for`, `pages_to_allocate`, `hit_pages`,
`lock_cost`, `capacity`) are `Pages`: one count per pool, compared element-wise.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from resin.cache.groups import Kind, StepRows, Undo, make_kind
from resin.cache.matching import NO_MATCH, Match
from resin.cache.pool import OutOfPagesError, PagePool
from resin.cache.prefix_index import PrefixIndex
from resin.plan import CacheGroupPlan
from resin.protocols import CacheLayout

I32 = npt.NDArray[np.int32]
Pages = npt.NDArray[np.int64]
"""Page counts, one per pool (token region first, then the state region if any)."""
_NONE = np.zeros(0, dtype=np.int32)


@dataclass(frozen=True, slots=True)
class PageReservation:
    """What `reserve` changed, so `rollback` can undo it exactly (one `Undo` per group)."""

    slots: I32
    undo: tuple[Undo, ...]
    prefill: bool

    def rows(self, keep: npt.NDArray[np.bool_]) -> PageReservation:
        """A decode reservation restricted to the kept rows (a pipelined step some of whose
        requests left while it was in flight)."""
        assert not self.prefill, "only decode steps are pipelined"
        undo = tuple(u[keep] if isinstance(u, np.ndarray) else u for u in self.undo)
        assert all(u is None or isinstance(u, np.ndarray) for u in undo)
        return PageReservation(self.slots[keep], undo, False)


class CacheManager:
    """Pages for every slot in every group (see the module docstring)."""

    def __init__(
        self,
        layout: CacheLayout,
        max_sequences: int,
        table_width: int,
        prefix_cache: bool = False,
    ) -> None:
        self.layout = layout
        self.page_size = layout.page_size
        self.pools = [PagePool(layout.num_pages)]
        if any(spec.state_region for spec in layout.groups):
            self.pools.append(PagePool(max(1, layout.state_pages)))
        self.pool = self.pools[0]
        self._capacity = np.asarray([p.num_pages for p in self.pools], dtype=np.int64)
        self._total_pages = int(self._capacity.sum())
        self.groups: list[Kind] = [
            make_kind(spec, i, self.pools, max_sequences, table_width, layout.page_size)
            for i, spec in enumerate(layout.groups)
        ]
        self._growing = np.bincount(
            [g.pool_index for g in self.groups if g.grows], minlength=len(self.pools)
        ).astype(np.int64)
        self.prefix = (
            PrefixIndex(self.pools, self.groups, layout.page_size) if prefix_cache else None
        )

    # -- capacity -------------------------------------------------------------------------
    def _zeros(self) -> Pages:
        return np.zeros(len(self.pools), dtype=np.int64)

    @property
    def capacity(self) -> Pages:
        """Pages of each pool."""
        return self._capacity

    @property
    def growing_groups(self) -> Pages:
        """Groups per pool whose pages grow while a sequence decodes (State rings do not)."""
        return self._growing

    def available(self) -> Pages:
        """Pages a live request can get now: free ones plus those only the prefix cache
        holds (`make_free` can evict every one of them, on a live path or not)."""
        return np.asarray([p.num_free + p.num_cache_only for p in self.pools], dtype=np.int64)

    def make_free(self, pool: int, n: int) -> bool:
        """Ensure `n` pages of pool `pool` are free, evicting least recently used prefix
        entries if needed."""
        if n > self.pools[pool].num_free and self.prefix is not None:
            self.prefix.trie.evict(pool, n)
        return self.pools[pool].num_free >= n

    def max_pages_for(self, length: int, chunk: int) -> Pages:
        """Upper bound on pages a sequence of `length` tokens holds while it is computed."""
        total = self._zeros()
        for g in self.groups:
            total[g.pool_index] += g.max_pages_for(length, chunk, self.prefix is not None)
        return total

    def pages_to_allocate(self, slots: I32, cached: I32, totals: I32, prefill: bool) -> Pages:
        """Pages `reserve` must take for this step (State checkpoints are extra, best effort)."""
        n = self._zeros()
        ckpt = self.prefix is not None and prefill
        for g in self.groups:
            n[g.pool_index] += g.pages_to_allocate(slots, cached, totals, ckpt)
        return n

    def usage(self) -> float:
        """Pages held by live requests (0-1, all regions): evictable prefix-cache pages are
        not counted, so an idle engine reads 0 and a page leak shows."""
        used = sum(p.num_used for p in self.pools)
        return (used - self.evictable()) / self._total_pages

    def prefix_usage(self) -> float:
        """Pages held only by the prefix cache (evictable on demand), 0-1."""
        return self.evictable() / self._total_pages

    def evictable(self) -> int:
        return sum(p.num_cache_only for p in self.pools)

    # -- prefix matching ------------------------------------------------------------------
    def match(self, tokens: I32) -> Match:
        """The longest prefix hit for the known `tokens` of a sequence, valid for every group
        (none without prefix caching)."""
        return NO_MATCH if self.prefix is None else self.prefix.match(tokens)

    def hit_pages(self, match: Match) -> Pages:
        """Pages a hit attaches (they count towards `max_pages_for` but are not new)."""
        total = self._zeros()
        for g in self.groups:
            total[g.pool_index] += g.hit_pages(match.tokens, len(match.nodes))
        return total

    def lock_cost(self, match: Match) -> Pages:
        """Evictable pages that admitting with `match` takes out of `available()`: those of
        the hit's pages the slot will reference that only the prefix cache holds now."""
        cost = self._zeros()
        if not match.nodes:
            return cost
        path = list(match.nodes)
        for g in self.groups:
            ids = g.hit_page_ids(path, match.tokens)
            cost[g.pool_index] += int(np.count_nonzero(g.pool.refcount[ids] == 1))
        return cost

    def held(self, slot: int) -> Pages:
        """Pages the slot references now, per pool."""
        total = self._zeros()
        for g in self.groups:
            total[g.pool_index] += g.held(slot).size
        return total

    @property
    def prefix_queries(self) -> int:
        return 0 if self.prefix is None else self.prefix.queries

    @property
    def prefix_hits(self) -> int:
        return 0 if self.prefix is None else self.prefix.hits

    # -- lifecycle ------------------------------------------------------------------------
    def admit(self, slot: int, num_tokens: int, match: Match = NO_MATCH) -> int:
        """Give a fresh slot (a sequence of `num_tokens` known tokens) the pages of its
        prefix hit and what each kind starts with (State rings); returns the hit length in
        tokens (already computed)."""
        if self.prefix is not None:
            self.prefix.attach(slot, match, num_tokens)
        path = list(match.nodes)
        hits = [g.hit_page_ids(path, match.tokens) for g in self.groups]
        for g, hit in zip(self.groups, hits, strict=True):
            g.pool.incref(hit)  # before any allocation, which could evict cache-only pages
        for g, hit in zip(self.groups, hits, strict=True):
            g.admit(slot, match.tokens, hit, self._alloc(g.pool_index, g.admit_pages))
        return match.tokens

    def reserve(
        self, slots: I32, cached: I32, totals: I32, prefill: bool = False
    ) -> PageReservation:
        """Allocate pages for positions < `totals` (and, with prefix caching in a prefill step,
        State checkpoint pages at page-aligned positions, as many as the state region
        allows). All or nothing: raises `OutOfPagesError` before taking anything when the
        pages are not there."""
        ckpt = self.prefix is not None and prefill
        counts = [g.pages_to_allocate(slots, cached, totals, ckpt) for g in self.groups]
        need = self._zeros()
        for g, n in zip(self.groups, counts, strict=True):
            need[g.pool_index] += n
        for p, n in enumerate(need.tolist()):
            if n and not self.make_free(p, n):
                raise OutOfPagesError(
                    f"a step needs {n} pages of pool {p}, {self.available()[p]} available"
                )
        undo: list[Undo] = []
        for g, n in zip(self.groups, counts, strict=True):
            if ckpt:
                n += self._checkpoint_pages(g, cached, totals)
            undo.append(g.reserve(slots, cached, totals, self._alloc(g.pool_index, n), ckpt))
        return PageReservation(slots, tuple(undo), prefill)

    def _checkpoint_pages(self, g: Kind, cached: I32, totals: I32) -> int:
        """Best-effort checkpoints for a State kind: every wanted one, else each row's
        deepest, else none (they only make later prefix hits possible)."""
        wanted = g.wanted_checkpoints(cached, totals)
        if wanted == 0:
            return 0
        for n in (wanted, int((totals // self.page_size > cached // self.page_size).sum())):
            if self.make_free(g.pool_index, n):
                return n
        return 0

    def abandon(self, reservation: PageReservation) -> None:
        """A failed step's requests are being quarantined: free what only the step held
        (State checkpoint pages; the rest goes with the requests' slots)."""
        for g, undo in zip(self.groups, reservation.undo, strict=True):
            g.end_step(undo)

    def rollback(self, reservation: PageReservation) -> None:
        for g, undo in zip(self.groups, reservation.undo, strict=True):
            g.rollback(reservation.slots, undo)

    def trim(self, reservation: PageReservation, totals: I32) -> None:
        """A speculative step keeps fewer positions than it reserved: return the pages it added
        wholly past `totals` (rejected drafts); a kept page's stale tail is rewritten later."""
        for g, undo in zip(self.groups, reservation.undo, strict=True):
            g.trim(reservation.slots, undo, totals)

    def commit(self, reservation: PageReservation, totals: I32, tokens: Sequence[I32] = ()) -> None:
        """The step succeeded: State rings flip, new full pages enter the prefix cache (before
        Windows drop what the next query cannot see, so the cache keeps them). In a prefill
        step `tokens[i]` holds at least `totals[i]` tokens of row i's sequence."""
        slots = reservation.slots
        for g, undo in zip(self.groups, reservation.undo, strict=True):
            g.commit(slots, undo)
        if self.prefix is not None and reservation.prefill and tokens:
            self.prefix.publish_step(slots, totals, tokens, reservation.undo)
        for g, undo in zip(self.groups, reservation.undo, strict=True):
            g.end_step(undo)  # the trie took its own reference on what it kept
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

    def _alloc(self, pool: int, n: int) -> I32:
        if n <= 0:
            return _NONE
        if not self.make_free(pool, n):
            raise OutOfPagesError(f"asked for {n} pages, {self.available()[pool]} available")
        return self.pools[pool].alloc(n)

    # -- planning -------------------------------------------------------------------------
    def group_plans(
        self, reservation: PageReservation, cached: I32, total: I32, tok_rows: I32, positions: I32
    ) -> tuple[CacheGroupPlan, ...]:
        rows = StepRows(reservation.slots, cached, total, tok_rows, positions)
        return tuple(
            g.plan(rows, undo) for g, undo in zip(self.groups, reservation.undo, strict=True)
        )

    # -- checks ---------------------------------------------------------------------------
    def check_invariants(self, live_slots: list[int]) -> None:
        """Every reference in each pool is held by a live slot entry or by the prefix trie."""
        held: list[list[I32]] = [[] for _ in self.pools]
        for s in live_slots:
            for g in self.groups:
                held[g.pool_index].append(g.held(s))
        if self.prefix is not None:
            self.prefix.check_invariants(live_slots)
            for p, trie_pages in enumerate(self.prefix.trie.held_pages()):
                held[p].append(trie_pages)
        for pool, pages in zip(self.pools, held, strict=True):
            pool.check_invariants()
            flat = np.concatenate(pages) if pages else _NONE
            expected = np.bincount(flat, minlength=pool.num_pages)
            assert np.array_equal(expected, pool.refcount), "refcounts disagree with holders"
