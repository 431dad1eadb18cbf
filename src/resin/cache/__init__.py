"""The paged cache: one flat page arena (pool), per-group tables, the prefix trie and index."""

from resin.cache.groups import PagedGroup, StateGroup
from resin.cache.manager import CacheManager, Reservation
from resin.cache.matching import Match
from resin.cache.pool import OutOfPagesError, PagePool
from resin.cache.prefix import PrefixCache
from resin.cache.reuse import PrefixIndex

__all__ = [
    "CacheManager",
    "Match",
    "OutOfPagesError",
    "PagePool",
    "PagedGroup",
    "PrefixCache",
    "PrefixIndex",
    "Reservation",
    "StateGroup",
]
