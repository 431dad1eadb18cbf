"""The paged cache: one flat page arena (pool), per-group tables, the prefix trie and index."""

from resin.cache.groups import PagedGroup, StateGroup
from resin.cache.manager import CacheManager, PageReservation
from resin.cache.matching import Match
from resin.cache.pool import OutOfPagesError, PagePool
from resin.cache.prefix_index import PrefixIndex
from resin.cache.trie import PrefixTrie

__all__ = [
    "CacheManager",
    "Match",
    "OutOfPagesError",
    "PagePool",
    "PageReservation",
    "PagedGroup",
    "PrefixIndex",
    "PrefixTrie",
    "StateGroup",
]
