"""Prefix cache: a block trie of full pages keyed by their exact tokens, with an LRU.

Node at depth k stands for the first k pages of some token sequence (the path's keys). For each
cache group it may hold a page (-1: not available):
- History / Window: the page with that group's K/V of tokens `(k-1)*page_size .. k*page_size-1`;
- Compressed: the entry page that the first `k * page_size` tokens complete, if one does;
- State: a checkpoint of the state after `k * page_size` tokens.
Each group's pages belong to one pool (token or state region); counts are kept per pool.
Cached pages are immutable and shared: the trie holds one reference on each page it stores
(`PagePool.cache`), and every request whose path runs through a node (it matched or inserted
it) holds a *lock* on the node: the node stays, so the request's path stays contiguous.

A lock does not pin the node's pages; the request's own references do. A request references
only what it still reads (a Window's last pages, the checkpoint it resumed from once), so the
rest of its path's pages are held by the trie alone, and eviction may take them page by page
(`strip`) when no unlocked node is left to evict. Otherwise one long request could fill the
pool with pages of its own path that nobody reads, and retract itself forever.

Invariants (`check_invariants`):
- `evictable[p]` = pages of pool p stored in unlocked nodes; each such page has refcount 1
  (only the trie references it), so evicting an unlocked node frees exactly its pages;
- `lru` holds exactly the unlocked leaves; eviction takes leaves only, oldest first, so a path
  from the root is always contiguous;
- each pool's `cached` mask is exactly the pages the trie stores, each in one node.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

from resin.cache.pool import PagePool

I32 = npt.NDArray[np.int32]


class Node:
    __slots__ = ("children", "depth", "key", "lock", "pages", "parent")

    def __init__(self, key: bytes, parent: Node | None, depth: int, num_groups: int) -> None:
        self.key = key
        self.parent = parent
        self.depth = depth
        self.children: dict[bytes, Node] = {}
        self.pages = [-1] * num_groups
        self.lock = 0


class PrefixTrie:
    """The trie, its lock counts and the LRU of evictable leaves."""

    def __init__(self, pools: list[PagePool], group_pool: list[int]) -> None:
        self.pools = pools
        self.group_pool = group_pool
        """Pool index of each group's pages."""
        self.num_groups = len(group_pool)
        self.root = Node(b"", None, 0, self.num_groups)
        self.root.lock = 1  # never evicted
        self.lru: OrderedDict[Node, None] = OrderedDict()
        self.evictable = [0] * len(pools)
        self.num_nodes = 0
        self.owner: list[dict[int, tuple[Node, int]]] = [{} for _ in pools]
        """Per pool: the node and group of every page the trie stores."""
        self.used = [np.zeros(p.num_pages, dtype=np.int64) for p in pools]
        """Per pool: when each stored page's node was last locked or inserted (`strip`'s LRU)."""
        self._clock = 0

    def _count(self, node: Node, sign: int) -> None:
        for g, page in enumerate(node.pages):
            if page >= 0:
                self.evictable[self.group_pool[g]] += sign

    # -- lookup ---------------------------------------------------------------------------
    def walk(self, data: bytes, key_bytes: int) -> list[Node]:
        """The longest path of existing nodes whose keys are consecutive `key_bytes`-long
        slices of `data` (depth 1, 2, ...). Stops at the first miss: O(hit), not O(prompt)."""
        path: list[Node] = []
        node = self.root
        for start in range(0, len(data) - key_bytes + 1, key_bytes):
            child = node.children.get(data[start : start + key_bytes])
            if child is None:
                break
            path.append(child)
            node = child
        return path

    # -- locks ----------------------------------------------------------------------------
    def lock(self, nodes: list[Node]) -> None:
        for node in nodes:
            if node.lock == 0:
                self._count(node, -1)
                self.lru.pop(node, None)
            node.lock += 1
            self._touch(node)

    def _touch(self, node: Node) -> None:
        """Mark the node's pages used now (deeper nodes of one path count as more recent)."""
        self._clock += 1
        for g, page in enumerate(node.pages):
            if page >= 0:
                self.used[self.group_pool[g]][page] = self._clock

    def unlock(self, nodes: list[Node]) -> None:
        for node in reversed(nodes):
            node.lock -= 1
            assert node.lock >= 0, "prefix node unlocked more than locked"
            if node.lock == 0:
                self._count(node, 1)
                if not node.children:
                    self.lru[node] = None

    # -- insert ---------------------------------------------------------------------------
    def insert(
        self, parent: Node, key: bytes, pages: Sequence[int], taken: list[list[int]]
    ) -> Node:
        """The child of `parent` for `key`, created if needed, *locked by the caller*.

        Pages the node lacks are taken from `pages` and appended to `taken[pool]`: the caller must
        add the trie's reference on them (`PagePool.cache`, batched: one pool call per step).
        Pages the node already has win (the caller swaps its duplicates for them).
        """
        node = parent.children.get(key)
        if node is None:
            node = Node(key, parent, parent.depth + 1, self.num_groups)
            parent.children[key] = node
            self.num_nodes += 1
            if parent.lock == 0:
                self.lru.pop(parent, None)  # no longer a leaf
        elif node.lock == 0:
            self._count(node, -1)
            self.lru.pop(node, None)
        node.lock += 1
        node_pages = node.pages
        for g, page in enumerate(pages):
            if page >= 0 and node_pages[g] < 0:
                node_pages[g] = page
                pool = self.group_pool[g]
                taken[pool].append(page)
                self.owner[pool][page] = (node, g)
        self._touch(node)
        return node

    # -- eviction -------------------------------------------------------------------------
    def evict(self, pool: int, n: int) -> int:
        """Evict unlocked leaves, oldest first, then strip pages only the trie holds from
        locked nodes, until pool `pool` has `n` free pages or nothing is left to evict;
        returns the pages freed (all pools)."""
        freed = 0
        target = self.pools[pool]
        while target.num_free < n and self.lru:
            node, _ = self.lru.popitem(last=False)
            freed += self._remove(node)
        if target.num_free < n:
            freed += self.strip(pool, n - target.num_free)
        return freed

    def strip(self, pool: int, n: int) -> int:
        """Free up to `n` pages of pool `pool` that only the trie references, least recently
        used first, by taking them out of their nodes (which stay: a live request's path
        runs through them, and a later match stops short of a node that lacks a page its
        hit needs). Returns the pages freed."""
        target = self.pools[pool]
        pages = target.cache_only_pages()
        if pages.size > n:
            pages = pages[np.argpartition(self.used[pool][pages], n - 1)[:n]]
        owner = self.owner[pool]
        for page in pages.tolist():
            node, g = owner.pop(page)
            node.pages[g] = -1
            if node.lock == 0:
                self.evictable[pool] -= 1
        target.uncache(pages)
        return int(pages.size)

    def _remove(self, node: Node) -> int:
        self._count(node, -1)
        held = 0
        by_pool: list[list[int]] = [[] for _ in self.pools]
        for g, page in enumerate(node.pages):
            if page >= 0:
                p = self.group_pool[g]
                by_pool[p].append(page)
                del self.owner[p][page]
                held += 1
        for pool, pages in zip(self.pools, by_pool, strict=True):
            if pages:
                pool.uncache(np.asarray(pages, dtype=np.int32))
        parent = node.parent
        assert parent is not None
        del parent.children[node.key]
        self.num_nodes -= 1
        if parent.lock == 0 and not parent.children:
            self.lru[parent] = None
        return held

    def clear(self) -> int:
        """Evict every unlocked node and every page only the trie holds (tests: prove that
        nothing else holds pages)."""
        freed = 0
        while self.lru:
            node, _ = self.lru.popitem(last=False)
            freed += self._remove(node)
        for p, pool in enumerate(self.pools):
            freed += self.strip(p, pool.num_cache_only)
        return freed

    # -- checks ---------------------------------------------------------------------------
    def held_pages(self) -> list[I32]:
        """Pages the trie references, per pool."""
        out: list[list[int]] = [[] for _ in self.pools]
        stack = [self.root]
        while stack:
            node = stack.pop()
            for g, page in enumerate(node.pages):
                if page >= 0:
                    out[self.group_pool[g]].append(page)
            stack.extend(node.children.values())
        return [np.asarray(pages, dtype=np.int32) for pages in out]

    def check_invariants(self) -> None:
        evictable = [0] * len(self.pools)
        leaves: set[Node] = set()
        stack = list(self.root.children.values())
        while stack:
            node = stack.pop()
            stack.extend(node.children.values())
            assert node.lock >= 0
            if node.lock == 0:
                for g, page in enumerate(node.pages):
                    if page >= 0:
                        pool = self.group_pool[g]
                        evictable[pool] += 1
                        assert self.pools[pool].refcount[page] == 1, "unlocked page shared"
                if not node.children:
                    leaves.add(node)
            else:
                assert node.parent is not None
                parent = node.parent
                assert parent is self.root or parent.lock > 0, "a locked node's parent is unlocked"
        assert evictable == self.evictable, "evictable page count drifted"
        assert leaves == set(self.lru), "LRU differs from the unlocked leaves"
        for region, held, owner in zip(self.pools, self.held_pages(), self.owner, strict=True):
            assert np.unique(held).size == held.size, "a page is stored in two nodes"
            cached = np.flatnonzero(region.cached)
            assert np.array_equal(cached, np.sort(held)), "cached mask drifted"
            assert sorted(owner) == sorted(held.tolist()), "page owners drifted"
