"""Cache-group kinds: one class per kind, one interface the `CacheManager` loops over.

A kind keeps, per sequence slot, the pages its group holds, and answers every question the
manager asks about them: how many pages a row needs for its next tokens (`pages_to_allocate`,
`max_pages_for`), what `reserve` / `rollback` / `trim` / `commit` / `release` do, what a prefix
hit shares (`hit_ok`, `hit_page_ids`, `admit`, `hit_pages`) and publishes (`publish_pages`),
and what the plan row carries (`plan`). This module is the only place that tells kinds apart:
`KINDS` maps each spec class of `resin.protocols` to its kind, so a new kind is a spec class
plus a class here.

- `HistoryKind` / `WindowKind` (token pages): a slot's pages live in `table[slot, k]` for
  logical page k (tokens `k*page_size .. (k+1)*page_size - 1`). A Window releases pages that
  fall wholly out of the window at once (`slide`), marking them -1.
- `CompressedKind`: the same table in entry pages; page c holds entries
  `c*E .. (c+1)*E - 1` (E entries per page, `Compressed.entries_per_page`).
- `StateKind`: a two-page checkpoint ring per slot plus the page holding its current
  checkpoint, in the arena's state region (its own `PagePool`).

Everything is vectorized over slots: no Python loop per page or token on the step path.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import numpy.typing as npt

from resin.cache.pool import PagePool
from resin.plan import CacheGroupPlan
from resin.protocols import CacheGroupSpec, Compressed, History, State, Window

if TYPE_CHECKING:
    from resin.cache.trie import Node

I32 = npt.NDArray[np.int32]
I64 = npt.NDArray[np.int64]
_NONE = np.zeros(0, dtype=np.int32)


def ceil_div(a: npt.NDArray[np.int32] | int, b: int) -> npt.NDArray[np.int32]:
    return np.asarray((np.asarray(a) + (b - 1)) // b, dtype=np.int32)


@dataclass(frozen=True, slots=True)
class Checkpoints:
    """One State group's checkpoints of a step: rows' CSR over (flat token index, depth,
    page); after query token `token[c]` the state covers `depth[c] * page_size` tokens."""

    indptr: I32
    token: I32
    depth: I32
    pages: I32


Undo = I32 | Checkpoints | None
"""What one kind's `reserve` changed: a paged kind's old page counts per row, a State kind's
checkpoints (None: none taken)."""


@dataclass(frozen=True, slots=True)
class StepRows:
    """The rows of one step, shared by every kind's `plan`: slots, cached / total lengths,
    the slot and position of every flat query token."""

    slots: I32
    cached: I32
    total: I32
    tok_rows: I32
    positions: I32

    def query_start(self) -> I32:
        """Each row's first flat query token."""
        start = np.zeros(self.slots.size, dtype=np.int32)
        np.cumsum((self.total - self.cached)[:-1], out=start[1:])
        return start


@dataclass(frozen=True, slots=True)
class Placement:
    """Where a kind lives: its place in the plan (`index`), its pool (`pool_index` 1: the
    state region), and the size of its per-slot tables."""

    index: int
    pool: PagePool
    pool_index: int
    max_sequences: int
    table_width: int
    page_size: int


class Kind:
    """One cache group: its spec, its place in the plan (`index`), its pool and table."""

    spec: CacheGroupSpec

    def __init__(self, spec: CacheGroupSpec, at: Placement) -> None:
        self.spec = spec
        self.index = at.index
        self.pool = at.pool
        self.pool_index = at.pool_index
        self.page_size = at.page_size

    # -- sizing (pages of `self.pool`) ----------------------------------------------------
    def max_pages_for(self, length: int, chunk: int, checkpoints: bool) -> int:
        """Upper bound on pages one sequence of `length` tokens holds while computing it."""
        raise NotImplementedError

    def pages_to_allocate(self, slots: I32, cached: I32, totals: I32, checkpoints: bool) -> int:
        """Pages `reserve` must take for rows computing `cached .. totals - 1`."""
        raise NotImplementedError

    def hit_pages(self, tokens: int, k: int) -> int:
        """Pages a prefix hit of `k` nodes (`tokens` tokens) attaches to a slot, counted in
        `max_pages_for` (a State kind's borrowed checkpoint is not: it goes at the first
        commit)."""
        raise NotImplementedError

    def hit_page_ids(self, path: list[Node], tokens: int) -> I32:
        """The cached pages a slot starting with the hit `path` (`tokens` long, may be empty)
        references: what it reads, not every page of the path."""
        raise NotImplementedError

    # -- prefix cache -----------------------------------------------------------------------
    def hit_ok(self, path: list[Node], k: int) -> bool:
        """Whether the first `k` nodes of `path` hold what a slot resuming at
        `k * page_size` needs from this group."""
        raise NotImplementedError

    def publish_pages(self, slot: int, lo: int, hi: int, ckpt: dict[int, int]) -> list[int]:
        """The page the slot puts in the trie node at depth `j + 1`, for j in `lo .. hi-1`
        (-1: none). `ckpt`: State checkpoints of the step by depth."""
        raise NotImplementedError

    def use_cached(self, slot: int, j: int, page: int) -> bool:
        """The node at depth `j + 1` already had `page` (same contents): the slot uses it
        instead of its own copy, and the caller moves the references (True), or the slot
        holds no copy to swap (False)."""
        raise NotImplementedError

    # -- lifecycle --------------------------------------------------------------------------
    admit_pages = 0
    """Fresh pages of its pool a slot takes at admission (a State ring)."""
    grows = True
    """Whether a running sequence takes more pages as it decodes (admission keeps headroom
    for it in the kind's pool)."""

    def wanted_checkpoints(self, cached: I32, totals: I32) -> int:
        """Optional pages a prefill step with prefix caching would like (State checkpoints)."""
        return 0

    def admit(self, slot: int, tokens: int, hit: I32, fresh: I32) -> None:
        """Start a slot with a prefix hit `tokens` long whose pages are `hit` (`hit_page_ids`;
        the caller added their references) and `fresh` (`admit_pages` new pages)."""
        raise NotImplementedError

    def reserve(self, slots: I32, cached: I32, totals: I32, pages: I32, checkpoints: bool) -> Undo:
        """Give the rows the `pages` (allocated from `self.pool`, `pages_to_allocate` many)."""
        raise NotImplementedError

    def rollback(self, slots: I32, undo: Undo) -> None:
        """Return exactly what `reserve` took."""
        raise NotImplementedError

    def trim(self, slots: I32, undo: Undo, totals: I32) -> None:
        """Keep only what positions < `totals` need (a verify step rejected drafts)."""

    def commit(self, slots: I32, undo: Undo) -> None:
        """The step succeeded (before the prefix cache publishes it)."""

    def step_checkpoints(self, undo: Undo, row: int) -> dict[int, int]:
        """Checkpoint pages of one row of the step, by depth (State only)."""
        return {}

    def end_step(self, undo: Undo) -> None:
        """Drop what only the step held (after publishing, or for a quarantined step)."""

    def slide(self, slots: I32, next_positions: I32) -> None:
        """After commit and publish: release what no later query can see."""

    def release(self, slot: int) -> None:
        raise NotImplementedError

    def held(self, slot: int) -> I32:
        raise NotImplementedError

    # -- planning ---------------------------------------------------------------------------
    def plan(self, rows: StepRows, undo: Undo) -> CacheGroupPlan:
        raise NotImplementedError


class _Paged(Kind):
    """Append-only pages in a per-slot table (History, Window, Compressed).

    Invariants: `table[s, :live_from[s]]` are -1 (released), `table[s, live_from[s]:npages[s]]`
    are pages the slot holds one reference to, the rest are -1. A page covers `span` tokens;
    the trie node at depth d holds page `d * page_size // span - 1` when `d * page_size` is a
    multiple of `span` (every node when span == page_size).
    """

    window: int | None = None

    def __init__(self, spec: CacheGroupSpec, at: Placement) -> None:
        super().__init__(spec, at)
        self.span = at.page_size
        self.table = np.full((at.max_sequences, at.table_width), -1, dtype=np.int32)
        self.npages = np.zeros(at.max_sequences, dtype=np.int32)
        self.live_from = np.zeros(at.max_sequences, dtype=np.int32)

    def need(self, totals: I32) -> I32:
        """Pages a slot needs so that everything positions < `totals` write is addressable."""
        return ceil_div(totals, self.page_size)

    def first_live(self, tokens: int) -> int:
        """First page a query at `tokens` still reads (0 unless a Window)."""
        return 0

    # -- sizing ---------------------------------------------------------------------------
    def max_pages_for(self, length: int, chunk: int, checkpoints: bool) -> int:
        return int(self.need(np.asarray([length], dtype=np.int32))[0])

    def pages_to_allocate(self, slots: I32, cached: I32, totals: I32, checkpoints: bool) -> int:
        return int(np.maximum(self.need(totals) - self.npages[slots], 0).sum())

    def hit_pages(self, tokens: int, k: int) -> int:
        return tokens // self.span - self.first_live(tokens)

    # -- prefix cache ---------------------------------------------------------------------
    def _node_of(self, c: int) -> int:
        """Index in a path of the node that holds page c."""
        return (c + 1) * self.span // self.page_size - 1

    def hit_ok(self, path: list[Node], k: int) -> bool:
        tokens, gi = k * self.page_size, self.index
        return all(
            path[self._node_of(c)].pages[gi] >= 0
            for c in range(self.first_live(tokens), tokens // self.span)
        )

    def publish_pages(self, slot: int, lo: int, hi: int, ckpt: dict[int, int]) -> list[int]:
        if self.span == self.page_size:
            return self.table[slot, lo:hi].tolist()  # type: ignore[no-any-return]
        per = self.span // self.page_size
        row = self.table[slot]
        return [int(row[(j + 1) // per - 1]) if (j + 1) % per == 0 else -1 for j in range(lo, hi)]

    def use_cached(self, slot: int, j: int, page: int) -> bool:
        self.table[slot, (j + 1) * self.page_size // self.span - 1] = page
        return True

    # -- lifecycle ------------------------------------------------------------------------
    def hit_page_ids(self, path: list[Node], tokens: int) -> I32:
        gi = self.index
        return np.asarray(
            [
                path[self._node_of(c)].pages[gi]
                for c in range(self.first_live(tokens), tokens // self.span)
            ],
            dtype=np.int32,
        )

    def admit(self, slot: int, tokens: int, hit: I32, fresh: I32) -> None:
        n = tokens // self.span
        if n == 0:
            return
        first = n - hit.size
        self.table[slot, :first] = -1
        self.table[slot, first:n] = hit
        self.npages[slot] = n
        self.live_from[slot] = first

    def reserve(self, slots: I32, cached: I32, totals: I32, pages: I32, checkpoints: bool) -> Undo:
        old = self.npages[slots].copy()
        need = np.maximum(self.need(totals) - old, 0)
        if pages.size:
            rows = np.repeat(slots, need)
            starts = np.cumsum(need) - need
            cols = np.repeat(old, need) + (np.arange(pages.size) - np.repeat(starts, need))
            self.table[rows, cols] = pages
            self.npages[slots] = old + need
        return old

    def rollback(self, slots: I32, undo: Undo) -> None:
        assert isinstance(undo, np.ndarray)
        cur = self.npages[slots]
        extra = cur - undo
        if extra.any():
            rows = np.repeat(slots, extra)
            starts = np.cumsum(extra) - extra
            cols = np.repeat(undo, extra) + (np.arange(int(extra.sum())) - np.repeat(starts, extra))
            self.pool.decref(self.table[rows, cols])
            self.table[rows, cols] = -1
            self.npages[slots] = undo

    def trim(self, slots: I32, undo: Undo, totals: I32) -> None:
        # A kept page's stale tail (rejected drafts) is rewritten before anything reads it.
        assert isinstance(undo, np.ndarray)
        self.rollback(slots, np.maximum(undo, self.need(totals)).astype(np.int32))

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
    def _csr(self, slots: I32, start: I32, end: I32) -> tuple[I32, I32]:
        """(page_indptr, page_ids) of logical pages `start[i] .. end[i] - 1` of each row."""
        counts = end - start
        indptr = np.zeros(slots.size + 1, dtype=np.int32)
        np.cumsum(counts, out=indptr[1:])
        lo, hi = int(start.min()), int(end.max())
        sub = self.table[slots, lo:hi]
        if (start == lo).all() and (end == hi).all():
            return indptr, sub.reshape(-1)  # every row spans the same pages (common in decode)
        cols = np.arange(lo, hi, dtype=np.int32)
        return indptr, sub[(cols >= start[:, None]) & (cols < end[:, None])]


class HistoryKind(_Paged):
    """Full-attention KV of the whole context, page by page."""

    def plan(self, rows: StepRows, undo: Undo) -> CacheGroupPlan:
        ps = self.page_size
        start = self.first_visible(rows.cached)
        indptr, page_ids = self._csr(rows.slots, start, ceil_div(rows.total, ps))
        pos = rows.positions
        append = self.table[rows.tok_rows, pos // ps].astype(np.int64) * ps + pos % ps
        return CacheGroupPlan(
            group=self.index,
            page_indptr=indptr,
            page_ids=page_ids,
            page_start=start,
            append_slots=append,
        )

    def first_visible(self, positions: I32) -> I32:
        """Logical index of the oldest page a query at `positions` reads."""
        return np.zeros_like(positions)


class WindowKind(HistoryKind):
    """Sliding-window KV: a slot holds at most `ceil(size / page_size) + 1` pages between
    steps, however long it runs."""

    def __init__(self, spec: CacheGroupSpec, at: Placement) -> None:
        super().__init__(spec, at)
        assert isinstance(spec, Window)
        self.window = spec.size

    def first_visible(self, positions: I32) -> I32:
        assert self.window is not None
        first = np.maximum(positions - self.window + 1, 0) // self.page_size
        return np.asarray(first, dtype=np.int32)

    def first_live(self, tokens: int) -> int:
        assert self.window is not None
        return max(0, tokens - self.window + 1) // self.page_size

    def max_pages_for(self, length: int, chunk: int, checkpoints: bool) -> int:
        assert self.window is not None
        full = -(-length // self.page_size)
        return min(full, -(-(self.window + chunk) // self.page_size) + 1)

    def slide(self, slots: I32, next_positions: I32) -> None:
        keep_from = self.first_visible(next_positions)
        old = self.live_from[slots]
        drop = np.maximum(keep_from - old, 0)
        if drop.any():
            rows = np.repeat(slots, drop)
            starts = np.cumsum(drop) - drop
            cols = np.repeat(old, drop) + (np.arange(int(drop.sum())) - np.repeat(starts, drop))
            self.pool.decref(self.table[rows, cols])
            self.table[rows, cols] = -1
            self.live_from[slots] = old + drop


class CompressedKind(_Paged):
    """One entry per `ratio` tokens, written when its block completes (`Compressed`)."""

    def __init__(self, spec: CacheGroupSpec, at: Placement) -> None:
        super().__init__(spec, at)
        assert isinstance(spec, Compressed)
        self.ratio = spec.ratio
        self.per_page = spec.entries_per_page(at.page_size)
        self.span = spec.page_tokens(at.page_size)

    def need(self, totals: I32) -> I32:
        return ceil_div(np.asarray(totals) // self.ratio, self.per_page)

    def plan(self, rows: StepRows, undo: Undo) -> CacheGroupPlan:
        r, e = self.ratio, self.per_page
        first, last = rows.cached // r, rows.total // r
        end = self.need(rows.total)
        indptr, page_ids = self._csr(rows.slots, np.zeros_like(end), end)
        counts = (last - first).astype(np.int32)
        entry_indptr = np.zeros(rows.slots.size + 1, dtype=np.int32)
        np.cumsum(counts, out=entry_indptr[1:])
        n = int(entry_indptr[-1])
        if n:
            row = np.repeat(np.arange(rows.slots.size), counts)
            w = np.arange(n) - np.repeat(entry_indptr[:-1] - first, counts)
            pages = self.table[rows.slots[row], w // e].astype(np.int64)
            slots_ = pages * e + w % e
            token = rows.query_start()[row] + (w + 1) * r - 1 - rows.cached[row]
        else:
            slots_, token = np.zeros(0, dtype=np.int64), _NONE
        return CacheGroupPlan(
            group=self.index,
            page_indptr=indptr,
            page_ids=page_ids,
            page_start=np.zeros(rows.slots.size, dtype=np.int32),
            entry_indptr=entry_indptr,
            entry_slots=slots_,
            entry_token=np.asarray(token, dtype=np.int32),
        )


def checkpoint_positions(cached: I32, totals: I32, page_size: int) -> tuple[I32, I32, I32]:
    """Page-aligned state checkpoints inside each row's new tokens.

    Returns (indptr [B+1], flat query-token index [C], depth [C]): after query token
    `index[c]` the state covers `depth[c] * page_size` tokens.
    """
    lo = cached // page_size + 1
    hi = totals // page_size
    counts = np.maximum(hi - lo + 1, 0).astype(np.int32)
    indptr = np.zeros(cached.size + 1, dtype=np.int32)
    np.cumsum(counts, out=indptr[1:])
    n = int(indptr[-1])
    depth = (np.arange(n) - np.repeat(indptr[:-1] - lo, counts)).astype(np.int32)
    qstart = np.zeros(cached.size + 1, dtype=np.int32)
    np.cumsum(totals - cached, out=qstart[1:])
    rows = np.repeat(np.arange(cached.size), counts)
    index = (qstart[rows] + depth * page_size - 1 - cached[rows]).astype(np.int32)
    return indptr, index, depth


def deepest_only(indptr: I32, token: I32, depth: I32) -> tuple[I32, I32, I32]:
    """Each row's last checkpoint only (when the state region cannot take them all)."""
    counts = np.diff(indptr)
    has = counts > 0
    last = indptr[1:][has] - 1
    out = np.zeros_like(indptr)
    np.cumsum(has, out=out[1:])
    return out.astype(np.int32), token[last], depth[last]


class StateKind(Kind):
    """A two-checkpoint ring per slot, in the state region.

    `ring[s]` holds the slot's two pages; `current[s]` is the page with its latest committed
    state (-1 = zero state, or a borrowed prefix-cache page listed in `borrowed[s]`).
    The plan reads `current` (`state_in`, immutable this step) and writes the ring page that
    is not `current` (`state_out`), so a rollback simply keeps `current`. With prefix caching,
    a prefill step also stores checkpoints at page-aligned positions (best effort: every one,
    else each row's deepest, else none, as the state region allows).
    """

    def __init__(self, spec: CacheGroupSpec, at: Placement) -> None:
        super().__init__(spec, at)
        self.ring = np.full((at.max_sequences, 2), -1, dtype=np.int32)
        self.current = np.full(at.max_sequences, -1, dtype=np.int32)
        self.borrowed = np.full(at.max_sequences, -1, dtype=np.int32)

    # -- sizing ---------------------------------------------------------------------------
    def max_pages_for(self, length: int, chunk: int, checkpoints: bool) -> int:
        return 2  # checkpoints are best effort: never needed to make progress

    def pages_to_allocate(self, slots: I32, cached: I32, totals: I32, checkpoints: bool) -> int:
        return 0

    def hit_pages(self, tokens: int, k: int) -> int:
        return 0  # the borrowed checkpoint is the trie's; the ring is new

    def wanted_checkpoints(self, cached: I32, totals: I32) -> int:
        return int(np.maximum(totals // self.page_size - cached // self.page_size, 0).sum())

    # -- prefix cache ---------------------------------------------------------------------
    def hit_ok(self, path: list[Node], k: int) -> bool:
        return path[k - 1].pages[self.index] >= 0

    def publish_pages(self, slot: int, lo: int, hi: int, ckpt: dict[int, int]) -> list[int]:
        return [ckpt.get(j + 1, -1) for j in range(lo, hi)]

    def use_cached(self, slot: int, j: int, page: int) -> bool:
        return False  # the step's checkpoint page is dropped at `end_step`

    # -- lifecycle ------------------------------------------------------------------------
    admit_pages = 2
    grows = False

    def hit_page_ids(self, path: list[Node], tokens: int) -> I32:
        """The checkpoint after the hit's `tokens` (borrowed until the first commit)."""
        return np.asarray([path[-1].pages[self.index]] if path else [], dtype=np.int32)

    def admit(self, slot: int, tokens: int, hit: I32, fresh: I32) -> None:
        """`fresh` is the slot's ring; it starts from the hit's checkpoint (borrowed)."""
        self.ring[slot] = fresh
        borrowed = int(hit[0]) if hit.size else -1
        self.current[slot] = borrowed
        self.borrowed[slot] = borrowed

    def reserve(self, slots: I32, cached: I32, totals: I32, pages: I32, checkpoints: bool) -> Undo:
        """`pages`: the checkpoint pages the manager could get for this step (every wanted
        one, each row's deepest, or none)."""
        if not checkpoints or pages.size == 0:
            return None
        indptr, token, depth = checkpoint_positions(cached, totals, self.page_size)
        if pages.size < token.size:
            indptr, token, depth = deepest_only(indptr, token, depth)
        assert pages.size == token.size
        return Checkpoints(indptr, token, depth, pages)

    def rollback(self, slots: I32, undo: Undo) -> None:
        self.end_step(undo)

    def commit(self, slots: I32, undo: Undo) -> None:
        self.current[slots] = self.state_out(slots)
        borrowed = self.borrowed[slots]
        held = borrowed[borrowed >= 0]
        if held.size:
            self.pool.decref(held)
            self.borrowed[slots] = -1

    def step_checkpoints(self, undo: Undo, row: int) -> dict[int, int]:
        if not isinstance(undo, Checkpoints):
            return {}
        lo, hi = int(undo.indptr[row]), int(undo.indptr[row + 1])
        return dict(zip(undo.depth[lo:hi].tolist(), undo.pages[lo:hi].tolist(), strict=True))

    def end_step(self, undo: Undo) -> None:
        if isinstance(undo, Checkpoints):
            self.pool.decref(undo.pages)

    def release(self, slot: int) -> None:
        pages = np.concatenate([self.ring[slot], self.borrowed[slot : slot + 1]])
        self.pool.decref(pages[pages >= 0])
        self.ring[slot] = -1
        self.current[slot] = -1
        self.borrowed[slot] = -1

    def held(self, slot: int) -> I32:
        pages = np.concatenate([self.ring[slot], self.borrowed[slot : slot + 1]])
        return pages[pages >= 0]

    # -- planning -------------------------------------------------------------------------
    def state_out(self, slots: I32) -> I32:
        ring = self.ring[slots]
        return np.where(self.current[slots] == ring[:, 0], ring[:, 1], ring[:, 0]).astype(np.int32)

    def plan(self, rows: StepRows, undo: Undo) -> CacheGroupPlan:
        slots = rows.slots
        if isinstance(undo, Checkpoints):
            indptr, token, page = undo.indptr, undo.token, undo.pages
        else:
            indptr, token, page = np.zeros(slots.size + 1, np.int32), _NONE, _NONE
        return CacheGroupPlan(
            group=self.index,
            state_in=self.current[slots],
            state_out=self.state_out(slots),
            checkpoint_indptr=indptr,
            checkpoint_token=token,
            checkpoint_page=page,
        )


KINDS: dict[type, type[Kind]] = {
    History: HistoryKind,
    Window: WindowKind,
    Compressed: CompressedKind,
    State: StateKind,
}
"""The kind of each spec class: the one table a new kind is added to."""


def make_kind(
    spec: CacheGroupSpec,
    index: int,
    pools: list[PagePool],
    max_sequences: int,
    table_width: int,
    page_size: int,
) -> Kind:
    """The kind for `spec`, on the state pool (`pools[1]`) or the token pool (`pools[0]`)."""
    pool_index = 1 if spec.state_region else 0
    kind = KINDS[type(spec)]
    at = Placement(index, pools[pool_index], pool_index, max_sequences, table_width, page_size)
    return kind(spec, at)


def sequence_pages(
    specs: tuple[CacheGroupSpec, ...], length: int, chunk: int, page_size: int
) -> tuple[int, int]:
    """(token pages, state pages) one sequence of `length` tokens holds while computed in
    chunks of `chunk` tokens, over all `specs`: what sizing the arena needs per sequence."""
    pools = [PagePool(1), PagePool(1)]
    width = -(-length // page_size)
    out = [0, 0]
    for i, spec in enumerate(specs):
        kind = make_kind(spec, i, pools, 1, width, page_size)
        out[kind.pool_index] += kind.max_pages_for(length, chunk, False)
    return out[0], out[1]
