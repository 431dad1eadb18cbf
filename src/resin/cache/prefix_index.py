"""The prefix index: which trie nodes each slot uses, hits, and publishing full pages.

`PrefixIndex` sits between the `CacheManager` (which owns the groups' page tables) and the
`PrefixTrie` (`trie.py`); it sees token arrays, never requests. Per slot it keeps the *path*
of trie nodes the slot locks: those its hit matched plus those it published. Publishing
inserts a slot's full pages (and State checkpoints) into the trie, as each group's kind
names them (`Kind.publish_pages`); a page another sequence
published first replaces the slot's own copy (identical contents), so duplicates do not pile up.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

from resin.cache.groups import Kind, Undo
from resin.cache.matching import NO_MATCH, Match, best_hit
from resin.cache.pool import PagePool
from resin.cache.trie import Node, PrefixTrie

I32 = npt.NDArray[np.int32]


class PrefixIndex:
    """Trie + per-slot paths + hit counters (see module docstring)."""

    def __init__(self, pools: list[PagePool], groups: list[Kind], page_size: int) -> None:
        self.pools = pools
        self.groups = groups
        self.page_size = page_size
        self.trie = PrefixTrie(pools, [g.pool_index for g in groups])
        self.paths: dict[int, list[Node]] = {}
        self.queries = 0
        self.hits = 0

    def match(self, tokens: I32) -> Match:
        """The longest hit for a sequence of known `tokens` valid for every group, always
        leaving the last known token to compute."""
        ps = self.page_size
        kmax = (tokens.size - 1) // ps
        if kmax <= 0:
            return NO_MATCH
        data = tokens[: kmax * ps].tobytes()
        path = self.trie.walk(data, 4 * ps)
        k = best_hit(path, self.groups)
        return Match(tuple(path[:k]), k * ps)

    def attach(self, slot: int, match: Match, num_tokens: int) -> None:
        """The slot (a sequence of `num_tokens` known tokens) starts with the hit's nodes
        locked (the manager attaches their pages)."""
        nodes = list(match.nodes)
        self.trie.lock(nodes)
        self.paths[slot] = nodes
        self.queries += num_tokens
        self.hits += match.tokens

    def release(self, slot: int, computed: I32 | None) -> None:
        """Publish the full pages of the slot's `computed` tokens (None: nothing, a
        quarantined sequence), then unlock its path."""
        if computed is not None:
            self.publish(slot, computed, computed.size // self.page_size, ())
        self.trie.unlock(self.paths.pop(slot, []))

    def publish_step(
        self, slots: I32, totals: I32, tokens: Sequence[I32], undo: Sequence[Undo]
    ) -> None:
        """After a prefill step: publish each row's full pages below `totals[row]`
        (`tokens[row]` holds at least that many tokens) and its State checkpoints (`undo`:
        what each group's `reserve` took)."""
        ps = self.page_size
        for row, (slot, total, toks) in enumerate(
            zip(slots.tolist(), totals.tolist(), tokens, strict=True)
        ):
            ckpt = tuple(g.step_checkpoints(u, row) for g, u in zip(self.groups, undo, strict=True))
            self.publish(slot, toks, total // ps, ckpt)

    def publish(self, slot: int, tokens: I32, upto: int, ckpt: Sequence[dict[int, int]]) -> None:
        """Insert the slot's full pages `len(path) .. upto-1` into the trie (locked by it);
        `ckpt[gi]`: group gi's checkpoints of this step by depth (empty: none)."""
        prefix = self.trie
        path = self.paths.setdefault(slot, [])
        lo = len(path)
        if upto <= lo:
            return
        ps = self.page_size
        data = tokens[: upto * ps].tobytes()
        step = 4 * ps  # int32 tokens
        cols = [
            g.publish_pages(slot, lo, upto, ckpt[gi] if ckpt else {})
            for gi, g in enumerate(self.groups)
        ]
        taken: list[list[int]] = [[] for _ in self.pools]
        swaps: list[tuple[int, int, int, int]] = []
        parent = path[-1] if path else prefix.root
        for j, pages in enumerate(zip(*cols, strict=True), lo):
            parent = prefix.insert(parent, data[j * step : (j + 1) * step], pages, taken)
            path.append(parent)
            if list(pages) != parent.pages:  # another request's copy (or no page) is cached
                for gi, page in enumerate(pages):
                    cached = parent.pages[gi]
                    if page >= 0 and cached != page:
                        swaps.append((gi, j, page, cached))
        for pool, new in zip(self.pools, taken, strict=True):
            if new:
                pool.cache(np.asarray(new, dtype=np.int32))
        if swaps:
            self._dedupe(slot, swaps)

    def _dedupe(self, slot: int, swaps: list[tuple[int, int, int, int]]) -> None:
        """Another request cached the same page first: use the cached copy (same tokens at
        the same positions, so the same contents) and free ours, so duplicates never pile up."""
        for gi, j, own, cached in swaps:
            g = self.groups[gi]
            if g.use_cached(slot, j, cached):
                g.pool.incref(np.asarray([cached], dtype=np.int32))
                g.pool.decref(np.asarray([own], dtype=np.int32))

    def check_invariants(self, live_slots: list[int]) -> None:
        self.trie.check_invariants()
        assert set(self.paths) <= set(live_slots), "a freed slot still locks trie nodes"
